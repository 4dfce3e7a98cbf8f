//! Links the guard as a static executable with no C library and no start files: it brings its
//! own `_start`, so the kernel jumps straight into it. A process start through the C library
//! costs about half a millisecond on a virtual machine (its CPU-feature probing traps to the
//! hypervisor), and every job pays for its guard's start.

fn main() {
    for arg in ["-nostartfiles", "-nostdlib", "-static", "-no-pie"] {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
}
