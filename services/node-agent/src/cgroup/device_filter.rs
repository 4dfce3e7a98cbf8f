//! GPU device isolation on cgroup v2: the device BPF program a job's cgroup gets, so that the
//! job can open only its own GPUs' device nodes.
//!
//! cgroup v2 has no `devices.allow`/`devices.deny` files; access to device nodes is decided by
//! BPF programs of type `BPF_PROG_TYPE_CGROUP_DEVICE` attached to the cgroup, as container
//! runtimes (runc, crun) and Slurm do it. This module owns that program: it assembles it by
//! hand ([`program`], pure and tested by running it), loads it and attaches it with raw
//! `bpf(2)` calls ([`attach`]); no BPF library is needed for a dozen instructions.
//!
//! The policy touches only NVIDIA's character devices (major 195): the per-GPU nodes
//! `/dev/nvidiaN` (minor N) of the job's GPUs and the control nodes every CUDA program opens
//! (`nvidiactl` 195:255, `nvidia-modeset` 195:254) are allowed, every other minor is denied.
//! Every other device is allowed: restricting `/dev/null` or the TTYs is not ours to do, and
//! `nvidia-uvm` has a major chosen at load time that we cannot name here.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;

use super::NVIDIA_MAJOR;

/// The control nodes every CUDA program opens, whatever its GPUs: `nvidia-modeset`, `nvidiactl`.
const CONTROL_MINORS: [u32; 2] = [254, 255];
/// Device minors are 20 bits (the kernel's MINORBITS): a larger one names no device.
const MINOR_MAX: u32 = (1 << 20) - 1;

/// One eBPF instruction, as the kernel's `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Insn {
    code: u8,
    /// `dst_reg:4, src_reg:4`, a C bitfield: which nibble is which follows the byte order.
    regs: u8,
    off: i16,
    imm: i32,
}

// Registers: r0 holds the verdict, r1 the context on entry, r2 is scratch.
const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;

// Opcodes, from their classes, operations and sources (`include/uapi/linux/bpf_common.h`).
const BPF_LDX: u8 = 0x01;
const BPF_JMP: u8 = 0x05;
const BPF_ALU64: u8 = 0x07;
const BPF_W: u8 = 0x00;
const BPF_MEM: u8 = 0x60;
const BPF_K: u8 = 0x00;
const BPF_AND: u8 = 0x50;
const BPF_MOV: u8 = 0xb0;
const BPF_JEQ: u8 = 0x10;
const BPF_JNE: u8 = 0x50;
const BPF_EXIT: u8 = 0x90;

/// `struct bpf_cgroup_dev_ctx`: `u32 access_type; u32 major; u32 minor;`.
const CTX_ACCESS_TYPE: i16 = 0;
const CTX_MAJOR: i16 = 4;
const CTX_MINOR: i16 = 8;
/// `access_type & 0xffff` is the device type, `access_type >> 16` the access asked for.
const DEV_TYPE_MASK: i32 = 0xffff;
const BPF_DEVCG_DEV_CHAR: i32 = 2;

impl Insn {
    fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        let regs = if cfg!(target_endian = "little") {
            (src << 4) | (dst & 0x0f)
        } else {
            (dst << 4) | (src & 0x0f)
        };
        Insn {
            code,
            regs,
            off,
            imm,
        }
    }

    /// `dst = *(u32 *)(src + off)`
    fn load_u32(dst: u8, src: u8, off: i16) -> Insn {
        Insn::new(BPF_LDX | BPF_MEM | BPF_W, dst, src, off, 0)
    }

    /// `dst &= imm`
    fn and(dst: u8, imm: i32) -> Insn {
        Insn::new(BPF_ALU64 | BPF_AND | BPF_K, dst, 0, 0, imm)
    }

    /// `dst = imm`
    fn mov(dst: u8, imm: i32) -> Insn {
        Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, dst, 0, 0, imm)
    }

    /// `if dst == imm goto +off`
    fn jump_eq(dst: u8, imm: i32, off: i16) -> Insn {
        Insn::new(BPF_JMP | BPF_JEQ | BPF_K, dst, 0, off, imm)
    }

    /// `if dst != imm goto +off`
    fn jump_ne(dst: u8, imm: i32, off: i16) -> Insn {
        Insn::new(BPF_JMP | BPF_JNE | BPF_K, dst, 0, off, imm)
    }

    /// `return r0`
    fn exit() -> Insn {
        Insn::new(BPF_JMP | BPF_EXIT, 0, 0, 0, 0)
    }
}

/// The device program for a job that may open the per-GPU nodes of `allowed_gpu_minors`.
///
/// Every test is "exit with r0 = 1 (allow) unless this is char 195 and a minor not allowed",
/// so every jump skips exactly one `exit`: no offsets to compute, none to overflow however
/// many minors there are. The verdict is 1 = allow, 0 = deny (the open fails with EPERM).
pub(crate) fn program(allowed_gpu_minors: &[u32]) -> Vec<Insn> {
    let mut minors: Vec<u32> = CONTROL_MINORS
        .iter()
        .chain(allowed_gpu_minors)
        .copied()
        .filter(|&minor| minor <= MINOR_MAX)
        .collect();
    minors.sort_unstable();
    minors.dedup();
    let mut insns = vec![
        Insn::mov(R0, 1),
        Insn::load_u32(R2, R1, CTX_ACCESS_TYPE),
        Insn::and(R2, DEV_TYPE_MASK),
        Insn::jump_eq(R2, BPF_DEVCG_DEV_CHAR, 1),
        Insn::exit(),
        Insn::load_u32(R2, R1, CTX_MAJOR),
        // 195 and every minor fit an i32 (minors are 20 bits), so the immediates compare as is.
        Insn::jump_eq(R2, NVIDIA_MAJOR.cast_signed(), 1),
        Insn::exit(),
        Insn::load_u32(R2, R1, CTX_MINOR),
    ];
    for minor in minors {
        insns.push(Insn::jump_ne(R2, minor.cast_signed(), 1));
        insns.push(Insn::exit());
    }
    insns.push(Insn::mov(R0, 0));
    insns.push(Insn::exit());
    insns
}

// `bpf(2)` commands, program type and attach type (`include/uapi/linux/bpf.h`).
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_ATTACH: libc::c_int = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
/// Runs alongside the programs of the cgroups above (systemd attaches its own device policy
/// to units with `BPF_F_ALLOW_MULTI`): an access must pass them all.
const BPF_F_ALLOW_MULTI: u32 = 1 << 1;
/// The verifier's log, asked for only when a load failed, to say why.
const LOG_SIZE: usize = 64 * 1024;
/// How much of the end of that log an error carries.
const LOG_LINES_KEPT: usize = 20;

/// `union bpf_attr` as `BPF_PROG_LOAD` reads it, up to `expected_attach_type`. The kernel
/// accepts a shorter attr than its own and treats the fields past it as zero.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    /// Left 0: device programs need none, and kernels before 4.17 reject it set.
    expected_attach_type: u32,
}

/// `union bpf_attr` as `BPF_PROG_ATTACH` reads it.
#[repr(C)]
#[derive(Default)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

/// Makes the job whose cgroup is `cgroup_dir` unable to open any NVIDIA GPU device node but
/// the per-GPU nodes of `allowed_gpu_minors` (and the control nodes), from now on.
///
/// The program stays attached (and loaded) until the cgroup is removed; its fd and the
/// directory's are closed here.
pub(crate) fn attach(cgroup_dir: &Path, allowed_gpu_minors: &[u32]) -> Result<(), String> {
    // std opens with O_CLOEXEC: no job started meanwhile inherits the directory.
    let dir = File::options()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(cgroup_dir)
        .map_err(|err| format!("opening the cgroup {}: {err}", cgroup_dir.display()))?;
    let prog = load(&program(allowed_gpu_minors))?;
    let attr = ProgAttachAttr {
        target_fd: fd_u32(dir.as_raw_fd()),
        attach_bpf_fd: fd_u32(prog.as_raw_fd()),
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
        replace_bpf_fd: 0,
    };
    bpf(BPF_PROG_ATTACH, &attr).map_err(|errno| {
        let hint = match errno {
            Errno::EPERM => {
                " (are we root with CAP_NET_ADMIN, and has no cgroup above attached a device \
                 program that forbids more below it?)"
            }
            Errno::EBADF => " (is it a cgroup v2 directory?)",
            _ => "",
        };
        format!(
            "attaching the GPU device filter to {}: {}{hint}",
            cgroup_dir.display(),
            errno.desc()
        )
    })?;
    Ok(())
}

/// Loads `insns` as a device program; on failure, loads it again with the verifier's log on,
/// so that the error says what the verifier objected to.
fn load(insns: &[Insn]) -> Result<OwnedFd, String> {
    let errno = match load_with_log(insns, None) {
        Ok(fd) => return Ok(fd),
        Err(errno) => errno,
    };
    let mut log = vec![0u8; LOG_SIZE];
    // A retry that works (the failure was transient, ENOMEM say) is as good as a first try.
    if let Ok(fd) = load_with_log(insns, Some(&mut log)) {
        return Ok(fd);
    }
    let hint = match errno {
        Errno::EPERM => " (are we root with CAP_BPF?)",
        _ => "",
    };
    let end = log.iter().position(|&byte| byte == 0).unwrap_or(log.len());
    let log = String::from_utf8_lossy(&log[..end]);
    // On one line, for the agent's log and the node's heartbeat; the verifier's objection is
    // at the end of its log, which can run to thousands of lines.
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let mut message = format!("loading the GPU device filter: {}{hint}", errno.desc());
    if !lines.is_empty() {
        message.push_str("; the verifier said: ");
        message.push_str(&lines[lines.len().saturating_sub(LOG_LINES_KEPT)..].join(" / "));
    }
    Err(message)
}

fn load_with_log(insns: &[Insn], log: Option<&mut [u8]>) -> Result<OwnedFd, Errno> {
    let license = c"GPL";
    let mut prog_name = [0u8; 16];
    // Shown by `bpftool prog`; at most 15 bytes of [A-Za-z0-9_.].
    let name = b"mgpu_gpu_filter";
    prog_name[..name.len()].copy_from_slice(name);
    let (log_level, log_size, log_buf) = match log {
        Some(log) => (
            1,
            u32::try_from(log.len()).unwrap_or(u32::MAX),
            log.as_mut_ptr(),
        ),
        None => (0, 0, std::ptr::null_mut()),
    };
    let attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: u32::try_from(insns.len()).map_err(|_| Errno::E2BIG)?,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level,
        log_size,
        log_buf: log_buf as u64,
        prog_name,
        ..ProgLoadAttr::default()
    };
    let fd = bpf(BPF_PROG_LOAD, &attr)?;
    // SAFETY: a successful BPF_PROG_LOAD returns a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `bpf(cmd, attr, sizeof attr)`: the fd or 0 it returns, or its errno.
fn bpf<A>(cmd: libc::c_int, attr: &A) -> Result<RawFd, Errno> {
    let size = libc::c_uint::try_from(size_of::<A>()).map_err(|_| Errno::E2BIG)?;
    // SAFETY: `attr` is a #[repr(C)] prefix of `union bpf_attr` for `cmd`, every pointer in it
    // is to memory that outlives the call (the kernel writes only into the log buffer, of
    // the size given), and `size` is its exact size.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_ref(attr), size) };
    if ret < 0 {
        return Err(Errno::last());
    }
    RawFd::try_from(ret).map_err(|_| Errno::EOVERFLOW)
}

/// A valid fd is never negative; the attr fields that carry fds are `__u32`.
fn fd_u32(fd: RawFd) -> u32 {
    u32::try_from(fd).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u32 = 1;
    const CHAR: u32 = 2;
    /// `BPF_DEVCG_ACC_READ | BPF_DEVCG_ACC_WRITE`, in the upper half of `access_type`.
    const READ_WRITE: u32 = (2 | 4) << 16;

    impl Insn {
        fn dst(self) -> usize {
            usize::from(if cfg!(target_endian = "little") {
                self.regs & 0x0f
            } else {
                self.regs >> 4
            })
        }

        fn src(self) -> usize {
            usize::from(if cfg!(target_endian = "little") {
                self.regs >> 4
            } else {
                self.regs & 0x0f
            })
        }
    }

    /// Runs `insns` as the kernel would on a device access, for only the instructions
    /// [`program`] emits (any other panics): true if it allows the access.
    fn run(insns: &[Insn], dev_type: u32, major: u32, minor: u32) -> bool {
        let ctx = [READ_WRITE | dev_type, major, minor];
        let mut regs: [Option<u64>; 11] = [None; 11];
        regs[1] = Some(0); // the context, as address 0 of `ctx`
        let mut pc = 0usize;
        loop {
            let insn = insns
                .get(pc)
                .unwrap_or_else(|| panic!("ran off the end at {pc}"));
            let (dst, src) = (insn.dst(), insn.src());
            assert!(dst < 11 && src < 11, "bad register at {pc}");
            let imm = i64::from(insn.imm).cast_unsigned(); // sign-extended, as the kernel does
            let value = |reg: usize| regs[reg].unwrap_or_else(|| panic!("r{reg} read unset"));
            let mut next = pc + 1;
            match insn.code {
                0x61 => {
                    assert_eq!(value(src), 0, "loads only from the context");
                    let off = usize::try_from(insn.off).unwrap_or_else(|e| panic!("{e}"));
                    assert!(
                        off.is_multiple_of(4) && off < 12,
                        "bad context offset {off}"
                    );
                    regs[dst] = Some(u64::from(ctx[off / 4]));
                }
                0x57 => regs[dst] = Some(value(dst) & imm),
                0xb7 => regs[dst] = Some(imm),
                0x15 | 0x55 => {
                    assert!(insn.off >= 0, "backward jump at {pc}");
                    if (value(dst) == imm) == (insn.code == 0x15) {
                        next += usize::try_from(insn.off).unwrap_or_else(|e| panic!("{e}"));
                    }
                }
                0x95 => {
                    let verdict = value(0);
                    assert!(verdict <= 1, "verdict {verdict}");
                    return verdict == 1;
                }
                code => panic!("unexpected opcode {code:#x} at {pc}"),
            }
            pc = next;
        }
    }

    #[test]
    fn insn_is_the_kernels_struct() {
        assert_eq!(size_of::<Insn>(), 8);
        let insn = Insn::load_u32(R2, R1, CTX_MINOR);
        assert_eq!((insn.dst(), insn.src(), insn.off), (2, 1, 8));
        assert_eq!(insn.code, 0x61);
        assert_eq!(size_of::<ProgLoadAttr>(), 72);
        assert_eq!(size_of::<ProgAttachAttr>(), 20);
    }

    #[test]
    fn only_the_given_gpus_and_the_control_nodes_are_allowed() {
        let insns = program(&[1, 3]);
        for minor in 0..300 {
            let allowed = [1, 3, 254, 255].contains(&minor);
            assert_eq!(run(&insns, CHAR, 195, minor), allowed, "195:{minor}");
        }
        assert!(!run(&insns, CHAR, 195, MINOR_MAX));
    }

    #[test]
    fn other_devices_are_not_ours() {
        let insns = program(&[]);
        assert!(run(&insns, CHAR, 1, 3), "/dev/null");
        assert!(run(&insns, CHAR, 1, 0));
        assert!(run(&insns, CHAR, 511, 0), "nvidia-uvm, a dynamic major");
        assert!(run(&insns, CHAR, 136, 2), "a pty");
        assert!(run(&insns, BLOCK, 195, 0), "a block device of major 195");
        assert!(!run(&insns, CHAR, 195, 0));
    }

    #[test]
    fn no_gpus_leaves_only_the_control_nodes() {
        let insns = program(&[]);
        assert!(run(&insns, CHAR, 195, 254));
        assert!(run(&insns, CHAR, 195, 255));
        for minor in (0..254).chain([256, 1000]) {
            assert!(!run(&insns, CHAR, 195, minor), "195:{minor}");
        }
    }

    #[test]
    fn minors_are_deduplicated_and_impossible_ones_dropped() {
        assert_eq!(program(&[3, 1, 3, 1, 255]), program(&[1, 3]));
        assert_eq!(program(&[u32::MAX, MINOR_MAX + 1]), program(&[]));
        let insns = program(&[7, 7]);
        assert!(run(&insns, CHAR, 195, 7));
        assert!(!run(&insns, CHAR, 195, 6));
    }

    /// Needs root (skips otherwise): the errors say what failed, and the verifier's why.
    #[test]
    fn failures_say_why() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: loading device filters needs root");
            return;
        }
        // r0 is never set: the verifier refuses it.
        let err = load(&[Insn::exit()])
            .err()
            .unwrap_or_else(|| panic!("it loaded"));
        eprintln!("{err}");
        assert!(err.starts_with("loading the GPU device filter: "), "{err}");
        assert!(
            err.contains("the verifier said: ") && err.contains("R0"),
            "{err}"
        );
        // Not a cgroup: the attach is refused.
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let err = attach(dir.path(), &[0])
            .err()
            .unwrap_or_else(|| panic!("it attached"));
        eprintln!("{err}");
        assert!(
            err.starts_with("attaching the GPU device filter to "),
            "{err}"
        );
        let missing = attach(&dir.path().join("gone"), &[0])
            .err()
            .unwrap_or_default();
        assert!(missing.starts_with("opening the cgroup "), "{missing}");
    }

    /// A cgroup made for a test, removed when the test ends, passed or not.
    struct ScratchCgroup(std::path::PathBuf);

    impl Drop for ScratchCgroup {
        fn drop(&mut self) {
            // The children have been reaped, but the kernel may take a moment to mark the
            // cgroup empty.
            for _ in 0..100 {
                match std::fs::remove_dir(&self.0) {
                    Err(err) if err.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    _ => return,
                }
            }
            eprintln!("could not remove {}", self.0.display());
        }
    }

    /// The unified hierarchy's mount (`cgroup.controllers` exists only in v2), hybrid or not.
    fn unified_mount() -> Option<&'static Path> {
        ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .map(Path::new)
            .find(|mount| mount.join("cgroup.controllers").exists())
    }

    /// What the process moved into `cgroup` says when it opens `node` (cat's stderr).
    fn open_inside(cgroup: &Path, node: &Path) -> String {
        let output = std::process::Command::new("/bin/sh")
            .args([
                "-c",
                r#"echo $$ > "$1/cgroup.procs" && exec cat "$2""#,
                "sh",
            ])
            .arg(cgroup)
            .arg(node)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running sh: {e}"));
        String::from_utf8_lossy(&output.stderr).trim().to_owned()
    }

    /// Needs root and a cgroup v2 hierarchy (skips otherwise): fake NVIDIA nodes (no driver
    /// behind them, so an open the filter allows fails with ENXIO) opened from a cgroup that
    /// may use GPU 1 only.
    #[test]
    fn a_job_cgroup_opens_only_its_gpus() {
        use nix::sys::stat::{Mode, SFlag, makedev, mknod};

        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: device filters need root");
            return;
        }
        let Some(mount) = unified_mount() else {
            eprintln!("skipped: no cgroup v2 hierarchy");
            return;
        };
        let nodes = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for (name, minor) in [("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)] {
            let dev = makedev(u64::from(NVIDIA_MAJOR), minor);
            let path = nodes.path().join(name);
            if let Err(err) = mknod(&path, SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), dev) {
                eprintln!("skipped: cannot make {}: {err}", path.display());
                return;
            }
        }
        // From here, outside the filtered cgroup: with no driver the open fails with ENXIO,
        // so an EPERM inside can only be the filter's.
        match File::open(nodes.path().join("nvidia0")) {
            Ok(_) => {
                eprintln!("skipped: an NVIDIA driver is loaded here; the test wants none");
                return;
            }
            Err(err) => assert_eq!(err.raw_os_error(), Some(libc::ENXIO), "outside: {err}"),
        }
        eprintln!("outside the cgroup, nvidia0: {}", Errno::ENXIO.desc());

        let dir = mount.join(format!("mgpu-test-devfilter-{}", std::process::id()));
        // One left by an earlier run of this pid that was killed: empty, so removable.
        let _ = std::fs::remove_dir(&dir);
        if let Err(err) = std::fs::create_dir(&dir) {
            eprintln!("skipped: cannot make {}: {err}", dir.display());
            return;
        }
        let cgroup = ScratchCgroup(dir);
        attach(&cgroup.0, &[1]).unwrap_or_else(|e| panic!("{e}"));

        for (name, expected) in [
            ("nvidia0", "Operation not permitted"),
            ("nvidia1", "No such device or address"),
            ("nvidiactl", "No such device or address"),
        ] {
            let said = open_inside(&cgroup.0, &nodes.path().join(name));
            eprintln!("inside the cgroup, {name}: {said}");
            assert!(
                said.ends_with(expected),
                "{name}: {said:?}, not {expected:?}"
            );
        }
    }
}
