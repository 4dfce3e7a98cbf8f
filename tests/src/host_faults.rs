//! Faults of a host's resources rather than of a process or a link, for the fault campaign:
//!
//! - **An agent's or a scheduler's wall clock stepped.** Each runs with libfaketime preloaded (the
//!   Debian package `libfaketime`), reading its offset from a file of its own; writing
//!   `+15` or `-8` there steps that process's `CLOCK_REALTIME` by that many seconds within a
//!   second (the library's cache), as an NTP step would. The monotonic clock is left alone,
//!   as a step leaves it. An agent's jobs read the kernel's clock: the job guard is statically
//!   linked, and jobs start with an environment of their own (no `LD_PRELOAD`). A
//!   nats-server's clock cannot be stepped this way (Go reads the clock without the C
//!   library), nor by a time namespace (which offsets the monotonic clocks only).
//! - **A nats-server's JetStream disk filled, or lost.** Each server's JetStream directory is a tmpfs
//!   of [`DISK_SIZE`], smaller than the store nats-server is allowed, so filling it with one
//!   file makes its writes fail with ENOSPC, for real; emptying it and restarting the server
//!   is the repair an operator makes. Lost: the server is killed and everything on its disk
//!   removed, and it starts again later on the empty directory, as on a replaced disk.
//!
//! The mounts carry the source name [`MOUNT_SOURCE`]: what a killed campaign left mounted is
//! unmounted when the next one starts.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian's libfaketime is.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// The source name of every JetStream disk mounted here.
const MOUNT_SOURCE: &str = "mgpu-campaign-js";
/// The size of each server's JetStream disk (the server is allowed 2 GB).
pub const DISK_SIZE: &str = "768m";
/// The file that fills a disk.
const FILLER: &str = "filler";

/// Whether agents' and schedulers' clocks can be stepped on this machine.
pub fn clocks_available() -> bool {
    Path::new(LIBFAKETIME).exists()
}

/// The environment that makes an agent read its wall clock's offset from `offset_file`
/// (created at `+0`).
pub fn fake_clock_env(offset_file: &Path) -> Vec<(String, String)> {
    if !offset_file.exists() {
        write_offset(offset_file, 0);
    }
    vec![
        ("LD_PRELOAD".into(), LIBFAKETIME.into()),
        (
            "FAKETIME_TIMESTAMP_FILE".into(),
            offset_file.display().to_string(),
        ),
        ("FAKETIME_CACHE_DURATION".into(), "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ]
}

/// Steps the clock that reads `offset_file` to `offset_secs` from the kernel's.
pub fn write_offset(offset_file: &Path, offset_secs: i64) {
    let text = format!("{offset_secs:+}\n");
    std::fs::write(offset_file, text).unwrap_or_else(|e| panic!("{}: {e}", offset_file.display()));
}

/// Mounts a tmpfs of [`DISK_SIZE`] on `dir` (made if missing).
pub fn mount_small_disk(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    run(Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={DISK_SIZE}"),
            MOUNT_SOURCE,
        ])
        .arg(dir));
}

/// Unmounts `dir`, mounted by [`mount_small_disk`] (lazily: a server may still be dying).
pub fn unmount_small_disk(dir: &Path) {
    let _ = Command::new("umount").arg("-l").arg(dir).status();
}

/// Unmounts every disk a killed campaign left.
pub fn unmount_leftovers() {
    for dir in leftover_mounts() {
        unmount_small_disk(&dir);
    }
}

fn leftover_mounts() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let source = fields.next()?;
            let target = fields.next()?;
            (source == MOUNT_SOURCE).then(|| PathBuf::from(target))
        })
        .collect()
}

/// Fills the disk mounted on `dir` with one file, to its last block: written a MiB at a time
/// until the disk says it is full (one `fallocate` of the free space can itself fail on the
/// blocks the file's own bookkeeping takes).
pub fn fill(dir: &Path) {
    use std::io::Write;
    let Ok(mut file) = std::fs::File::create(dir.join(FILLER)) else {
        return;
    };
    let chunk = vec![0u8; 1 << 20];
    while file.write_all(&chunk).is_ok() {}
    let _ = file.sync_all();
}

/// Removes everything on the disk mounted on `dir`: a server's JetStream data lost, as with a
/// disk replaced (its server must be stopped first).
pub fn wipe(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let _ = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
    }
}

/// Removes what [`fill`] wrote.
pub fn empty(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(FILLER));
}

fn run(command: &mut Command) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_is_written_with_its_sign() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("clock");
        write_offset(&file, 15);
        assert_eq!(
            std::fs::read_to_string(&file).ok().as_deref(),
            Some("+15\n")
        );
        write_offset(&file, -8);
        assert_eq!(std::fs::read_to_string(&file).ok().as_deref(), Some("-8\n"));
    }
}
