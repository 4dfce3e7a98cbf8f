//! Writing the files of a cluster's set-up so that no reader sees half of one and no secret
//! is ever readable by others: shared by the principals' keys ([`super::auth`]) and the TLS
//! certificates ([`super::tls`]).

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Writes a file only its owner can read, never leaving it readable by others even briefly.
pub fn write_secret(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

/// Writes next to the target, then renames over it, so readers never see half a file.
pub fn write_atomically(path: &Path, contents: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, contents)?;
    fs::rename(&tmp, path)
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
    fn secrets_are_private_even_when_they_replace_a_readable_file() {
        let Ok(dir) = tempfile::tempdir() else { return };
        let path = dir.path().join("key.nk");
        assert!(write_secret(&path, "SUSECRET\n").is_ok());
        assert_eq!(mode(&path), 0o600);
        assert_eq!(
            fs::read_to_string(&path).ok().as_deref(),
            Some("SUSECRET\n")
        );
        assert!(write_secret(&path, "SUOTHER\n").is_ok());
        assert_eq!(fs::read_to_string(&path).ok().as_deref(), Some("SUOTHER\n"));
    }

    #[test]
    fn an_atomic_write_leaves_no_temporary_file() {
        let Ok(dir) = tempfile::tempdir() else { return };
        let path = dir.path().join("auth.conf");
        assert!(write_atomically(&path, "one").is_ok());
        assert!(write_atomically(&path, "two").is_ok());
        assert_eq!(fs::read_to_string(&path).ok().as_deref(), Some("two"));
        assert!(!dir.path().join("auth.tmp").exists());
    }
}
