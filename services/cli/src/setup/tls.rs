//! TLS between every mgpu program and nats-server: a private certificate authority, the
//! server's certificate, and the `tls` blocks of the server configuration.
//!
//! `mgpu admin init --tls` and the test harness write, next to the nkeys:
//!
//! ```text
//! DIR/ca.pem           the CA certificate: what every client trusts (`--ca` / `MGPU_CA`)
//! DIR/ca-key.pem       the CA's private key, mode 0600: signs server certificates, nothing more
//! DIR/server-cert.pem  nats-server's certificate, signed by the CA (localhost, 127.0.0.1, ::1,
//!                      the host name and every `--tls-host`); it also authenticates routes
//! DIR/server-key.pem   its private key, mode 0600
//! ```
//!
//! A private CA rather than one self-signed server certificate: clients are given `ca.pem`
//! once, and a server certificate issued later (another host name, a renewal) needs no change
//! on any of them. Files that exist are kept, so running init again changes no key; an admin
//! may also put their own `ca.pem` and `ca-key.pem` there first and have init sign with them.
//! Clients still log in with their nkey: TLS encrypts the connection and proves the server's
//! identity, it does not replace the per-principal keys.

use std::fs;
use std::path::{Path, PathBuf};

use chrono::{Datelike, Duration, Utc};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use serde_json::json;

use super::files::{write_atomically, write_secret};

pub const CA_CERT_FILE: &str = "ca.pem";
pub const CA_KEY_FILE: &str = "ca-key.pem";
pub const SERVER_CERT_FILE: &str = "server-cert.pem";
pub const SERVER_KEY_FILE: &str = "server-key.pem";

/// How long a new CA is valid. Long: replacing it means handing every client a new `ca.pem`.
const CA_YEARS: i32 = 10;
/// How long a new server certificate is valid. Shorter: renewing it touches only the server
/// (remove `server-cert.pem` and `server-key.pem`, run init again, reload the server).
const SERVER_YEARS: i32 = 2;

/// Names every server certificate carries: clients on the server's own host reach it by these.
pub const LOCAL_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The files a TLS-enabled nats-server configuration names, as absolute paths (nats-server
/// resolves relative ones against its own working directory, not the configuration's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl TlsFiles {
    /// The standard file names inside the credentials directory `dir`.
    pub fn in_dir(dir: &Path) -> TlsFiles {
        TlsFiles {
            ca_file: dir.join(CA_CERT_FILE),
            cert_file: dir.join(SERVER_CERT_FILE),
            key_file: dir.join(SERVER_KEY_FILE),
        }
    }
}

/// What [`ensure_certificates`] did: the files, and which of them it wrote now.
#[derive(Clone, Debug)]
pub struct Certificates {
    pub files: TlsFiles,
    /// Created by this call (certificates and keys alike); the rest already existed.
    pub written: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("cannot write {path}: {error}")]
    Write { path: String, error: std::io::Error },
    #[error("{path} is not a usable {what}: {detail}")]
    Invalid {
        path: String,
        what: &'static str,
        detail: String,
    },
    #[error(
        "{present} exists but {missing} does not: restore {missing}, or remove {present} so that a new pair is made"
    )]
    HalfPair { present: String, missing: String },
    #[error("`{0}` cannot be a certificate name: use a host name or an IP address")]
    BadHost(String),
    #[error("generating a certificate: {0}")]
    Generate(String),
}

/// Makes sure `dir` holds a CA and a server certificate for `hosts` (host names or IP
/// addresses), creating what is missing and keeping what exists.
///
/// A server certificate that exists is kept even when `hosts` names others: to add a name,
/// remove `server-cert.pem` and `server-key.pem` and call this again (the CA stays, so clients
/// need nothing new). When the CA itself is new, the server certificate is issued again, since
/// one signed by a vanished CA could never be verified.
pub fn ensure_certificates(dir: &Path, hosts: &[String]) -> Result<Certificates, TlsError> {
    let files = TlsFiles::in_dir(dir);
    let ca_key_file = dir.join(CA_KEY_FILE);
    let mut written = Vec::new();

    let (issuer, new_ca) = match existing_pair(&files.ca_file, &ca_key_file)? {
        Some((cert_pem, key_pem)) => {
            let key = parse_key(&ca_key_file, &key_pem)?;
            let issuer =
                Issuer::from_ca_cert_pem(&cert_pem, key).map_err(|e| TlsError::Invalid {
                    path: files.ca_file.display().to_string(),
                    what: "CA certificate (PEM)",
                    detail: e.to_string(),
                })?;
            (issuer, false)
        }
        None => {
            let key = KeyPair::generate().map_err(generate)?;
            let params = ca_params()?;
            let cert = params.self_signed(&key).map_err(generate)?;
            write_secret(&ca_key_file, &key.serialize_pem()).map_err(write(&ca_key_file))?;
            write_atomically(&files.ca_file, &cert.pem()).map_err(write(&files.ca_file))?;
            written.extend([files.ca_file.clone(), ca_key_file.clone()]);
            (Issuer::new(params, key), true)
        }
    };

    let server_exists = existing_pair(&files.cert_file, &files.key_file)?.is_some();
    if new_ca || !server_exists {
        let key = KeyPair::generate().map_err(generate)?;
        let cert = server_params(hosts)?
            .signed_by(&key, &issuer)
            .map_err(generate)?;
        write_secret(&files.key_file, &key.serialize_pem()).map_err(write(&files.key_file))?;
        write_atomically(&files.cert_file, &cert.pem()).map_err(write(&files.cert_file))?;
        written.extend([files.cert_file.clone(), files.key_file.clone()]);
    }
    Ok(Certificates { files, written })
}

/// The names a server certificate made here carries: [`LOCAL_HOSTS`], then `extra` (the host
/// name, `--tls-host`), each once.
pub fn server_hosts(extra: &[String]) -> Vec<String> {
    let mut hosts: Vec<String> = LOCAL_HOSTS.iter().map(|h| (*h).to_owned()).collect();
    for host in extra.iter().map(|h| h.trim()).filter(|h| !h.is_empty()) {
        if !hosts.iter().any(|known| known.eq_ignore_ascii_case(host)) {
            hosts.push(host.to_owned());
        }
    }
    hosts
}

/// A nats-server `tls` block naming `files`, each line prefixed by `indent`.
///
/// With `verify`, the peer must present a certificate signed by the CA too. Routes set it (a
/// route has no other credentials, so this is what keeps a stranger out of the cluster);
/// client connections do not, since every client already proves who it is with its nkey.
/// Either way the listener speaks only TLS: a plaintext client is refused at the handshake.
pub fn render_tls_block(files: &TlsFiles, indent: &str, verify: bool) -> String {
    let path = |p: &Path| json!(p.display().to_string());
    let mut block = format!(
        "{indent}tls {{\n\
         {indent}  cert_file: {cert}\n\
         {indent}  key_file: {key}\n\
         {indent}  ca_file: {ca}\n",
        cert = path(&files.cert_file),
        key = path(&files.key_file),
        ca = path(&files.ca_file),
    );
    if verify {
        block.push_str(&format!("{indent}  verify: true\n"));
    }
    // The default handshake timeout (0.5 s) is too short for a busy machine starting a
    // scheduler, agents and a test run at once; 2 s still drops a stalled peer quickly.
    block.push_str(&format!("{indent}  timeout: 2\n{indent}}}\n"));
    block
}

/// Both files of a certificate and its key, read; None when neither exists.
fn existing_pair(cert: &Path, key: &Path) -> Result<Option<(String, String)>, TlsError> {
    match (cert.exists(), key.exists()) {
        (false, false) => Ok(None),
        (true, true) => Ok(Some((read(cert)?, read(key)?))),
        (true, false) => Err(half_pair(cert, key)),
        (false, true) => Err(half_pair(key, cert)),
    }
}

fn half_pair(present: &Path, missing: &Path) -> TlsError {
    TlsError::HalfPair {
        present: present.display().to_string(),
        missing: missing.display().to_string(),
    }
}

fn read(path: &Path) -> Result<String, TlsError> {
    fs::read_to_string(path).map_err(|error| TlsError::Read {
        path: path.display().to_string(),
        error,
    })
}

fn parse_key(path: &Path, pem: &str) -> Result<KeyPair, TlsError> {
    KeyPair::from_pem(pem).map_err(|e| TlsError::Invalid {
        path: path.display().to_string(),
        what: "private key (PEM)",
        detail: e.to_string(),
    })
}

fn write(path: &Path) -> impl Fn(std::io::Error) -> TlsError + '_ {
    move |error| TlsError::Write {
        path: path.display().to_string(),
        error,
    }
}

fn generate(err: rcgen::Error) -> TlsError {
    TlsError::Generate(err.to_string())
}

fn ca_params() -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "mgpu");
    name.push(DnType::CommonName, "mgpu certificate authority");
    params.distinguished_name = name;
    // Path length 0: this CA signs server certificates only, never another CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    set_validity(&mut params, CA_YEARS);
    Ok(params)
}

fn server_params(hosts: &[String]) -> Result<CertificateParams, TlsError> {
    if let Some(bad) = hosts.iter().find(|h| !is_host(h)) {
        return Err(TlsError::BadHost(bad.clone()));
    }
    // `new` turns names that parse as IP addresses into IP SANs, the rest into DNS names.
    let mut params = CertificateParams::new(hosts.to_vec()).map_err(generate)?;
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "mgpu");
    name.push(DnType::CommonName, "mgpu nats-server");
    params.distinguished_name = name;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Client auth too: a server dialling a route to a peer presents this same certificate,
    // and the peer's `verify: true` checks it.
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, SERVER_YEARS);
    Ok(params)
}

/// An IP address, or a DNS name (letters, digits, `-`, `.`; a leading `*.` for a wildcard).
fn is_host(name: &str) -> bool {
    if name.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let name = name.strip_prefix("*.").unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// Valid from a day ago (clocks of other hosts may lag) for `years`.
fn set_validity(params: &mut CertificateParams, years: i32) {
    let start = Utc::now() - Duration::days(1);
    // Day 28 at most: every month has it, so adding years never lands on a missing date.
    let day = start.day().min(28) as u8;
    let month = start.month() as u8;
    params.not_before = rcgen::date_time_ymd(start.year(), month, day);
    params.not_after = rcgen::date_time_ymd(start.year() + years, month, day);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        fs::metadata(path)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0)
    }

    #[test]
    fn init_makes_a_ca_and_a_server_certificate_then_keeps_them() {
        let Ok(dir) = tempfile::tempdir() else { return };
        let hosts = server_hosts(&["gpu-head.lab".to_owned(), "localhost".to_owned()]);
        assert_eq!(hosts, ["localhost", "127.0.0.1", "::1", "gpu-head.lab"]);
        let made = ensure_certificates(dir.path(), &hosts);
        assert!(made.is_ok(), "{made:?}");
        let Ok(made) = made else { return };
        assert_eq!(made.written.len(), 4);
        assert_eq!(mode(&dir.path().join(CA_KEY_FILE)), 0o600);
        assert_eq!(mode(&dir.path().join(SERVER_KEY_FILE)), 0o600);
        let ca = fs::read_to_string(&made.files.ca_file).unwrap_or_default();
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
        let server_key = fs::read_to_string(&made.files.key_file).unwrap_or_default();

        // Again: nothing is written, the keys stay.
        let again = ensure_certificates(dir.path(), &hosts).map(|c| c.written);
        assert_eq!(again.ok(), Some(Vec::new()));
        let key_after = fs::read_to_string(&made.files.key_file).unwrap_or_default();
        assert_eq!(server_key, key_after);

        // Without the server pair, a new one is signed by the kept CA.
        let _ = fs::remove_file(&made.files.cert_file);
        let _ = fs::remove_file(&made.files.key_file);
        let reissued = ensure_certificates(dir.path(), &hosts).map(|c| c.written);
        assert_eq!(
            reissued.ok(),
            Some(vec![
                made.files.cert_file.clone(),
                made.files.key_file.clone()
            ])
        );
        assert_eq!(
            fs::read_to_string(&made.files.ca_file).unwrap_or_default(),
            ca
        );

        // Half a pair is an error naming both files, not a silent new key.
        let _ = fs::remove_file(&made.files.key_file);
        let err = ensure_certificates(dir.path(), &hosts)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(SERVER_CERT_FILE), "{err}");
        assert!(err.contains(SERVER_KEY_FILE), "{err}");
    }

    #[test]
    fn client_blocks_do_not_ask_for_client_certificates_and_route_blocks_do() {
        let files = TlsFiles::in_dir(Path::new("/etc/mgpu"));
        let client = render_tls_block(&files, "", false);
        assert!(
            client.starts_with("tls {\n  cert_file: \"/etc/mgpu/server-cert.pem\"\n"),
            "{client}"
        );
        assert!(
            client.contains("  key_file: \"/etc/mgpu/server-key.pem\"\n"),
            "{client}"
        );
        assert!(
            client.contains("  ca_file: \"/etc/mgpu/ca.pem\"\n"),
            "{client}"
        );
        assert!(!client.contains("verify"), "{client}");
        assert!(client.ends_with("  timeout: 2\n}\n"), "{client}");
        let route = render_tls_block(&files, "  ", true);
        assert!(route.starts_with("  tls {\n"), "{route}");
        assert!(route.contains("    verify: true\n"), "{route}");
        assert!(route.ends_with("  }\n"), "{route}");
    }

    #[test]
    fn a_name_that_is_not_a_host_is_refused() {
        let Ok(dir) = tempfile::tempdir() else { return };
        let err = ensure_certificates(dir.path(), &["bad host".to_owned()])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("cannot be a certificate name"), "{err}");
    }
}
