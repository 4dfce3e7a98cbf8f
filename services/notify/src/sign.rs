//! Webhook signatures: `X-Mgpu-Signature: sha256=<hex>`, the HMAC-SHA256 of the request body
//! keyed with the owner's secret, so a receiver can check that a notice came from mgpu and
//! was not changed. HMAC (RFC 2104) is a few lines over SHA-256; written here rather than
//! pulling in a crate for it, and checked against RFC 4231's test vectors.

use sha2::{Digest as _, Sha256};

/// The header every webhook request carries.
pub const SIGNATURE_HEADER: &str = "X-Mgpu-Signature";

const BLOCK: usize = 64;

/// HMAC-SHA256 of `message` under `key`.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// The header's value for `body` under `secret`: `sha256=` and the lowercase hex digest.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let digest = hmac_sha256(secret.as_bytes(), body);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn rfc_4231_vectors() {
        // Test case 2: a short key.
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block, hashed first.
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn the_header_value_is_prefixed_hex() {
        let value = signature("secret", b"{}");
        assert!(value.starts_with("sha256="));
        assert_eq!(value.len(), 7 + 64);
    }
}
