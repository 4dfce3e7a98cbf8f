//! Links `mgpu` as a position-dependent executable. Every command is a new process, and a PIE
//! binary of this size first applies some 22 000 relocations (measured with `readelf`): about
//! 0.3 ms of each `mgpu submit`. The CLI runs with its user's rights only, so the address-space
//! randomisation of the executable itself is worth less here than in the services.
//! `scripts/setup.sh` goes further and links it statically (`relocation-model=static`, which
//! agrees with this flag).
fn main() {
    println!("cargo:rustc-link-arg-bins=-no-pie");
}
