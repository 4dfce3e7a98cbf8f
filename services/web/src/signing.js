// Signed requests, exactly as the CLI signs them (shared/protocol/src/signing.rs): an ed25519
// signature with the user's nkey over "mgpu-request\n<subject>\n<ms>\n<nonce>\n" followed by
// the payload, carried in four headers. The scheduler cannot tell the page from the CLI.

export const SIGNER = "Mgpu-Signer";
export const SIGNED_AT = "Mgpu-Signed-At";
export const NONCE = "Mgpu-Nonce";
export const SIGNATURE = "Mgpu-Signature";
export const PROTOCOL = "Mgpu-Protocol";

const encoder = new TextEncoder();

/** The bytes a signature covers. */
export function signedBytes(subject, signedAtMs, nonce, payload) {
  const head = encoder.encode(`mgpu-request\n${subject}\n${signedAtMs}\n${nonce}\n`);
  const bytes = new Uint8Array(head.length + payload.length);
  bytes.set(head, 0);
  bytes.set(payload, head.length);
  return bytes;
}

export function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** A fresh nonce: 32 hexadecimal digits, as the CLI's (a UUID v4 without dashes). */
export function freshNonce() {
  return crypto.randomUUID().replaceAll("-", "");
}

/**
 * The signature headers, as [name, value] pairs, for `payload` (bytes) published on
 * `subject` by the key pair `keyPair` (an nkeys KeyPair) at `nowMs`.
 */
export function signatureHeaders(keyPair, subject, payload, nowMs, nonce = freshNonce()) {
  const signature = keyPair.sign(signedBytes(subject, nowMs, nonce, payload));
  return [
    [SIGNER, keyPair.getPublicKey()],
    [SIGNED_AT, String(nowMs)],
    [NONCE, nonce],
    [SIGNATURE, hex(signature)],
    [PROTOCOL, "1"],
  ];
}

/**
 * The nkey seed in the text of a seed file (`mgpu admin add-user` writes one: the seed alone,
 * or with comment lines), or an Error saying what is wrong with it.
 */
export function seedFromFile(text) {
  const found = String(text).match(/\bS[UA][A-Z2-7]{56}\b/);
  if (!found) {
    return new Error(
      "this file holds no nkey seed (a seed is 58 characters starting with SU; " +
        "mgpu admin add-user writes it to .mgpu/auth/keys/<role>-<name>.nk)",
    );
  }
  return found[0];
}
