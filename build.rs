// Nothing to build. The script exists for its [build-dependencies] (see Cargo.toml): they put the
// same features on the build-time crates as the Python wheel's build does, so the wheel reuses
// Ballista and this crate as `cargo test` built them instead of compiling them again.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
