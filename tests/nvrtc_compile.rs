//! Compiles every kernel of `kernels/` with NVRTC (no GPU needed), so a kernel that does not
//! compile fails CI. Without libnvrtc the test passes with a note, unless
//! SPARSE_KNN_REQUIRE_NVRTC=1 (CI installs pip's nvidia-cuda-nvrtc and sets it).

use datafusion_sparse_knn::gpu::kernels;

#[test]
fn every_kernel_compiles_with_nvrtc() {
    let required = std::env::var("SPARSE_KNN_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    if !kernels::nvrtc_available() {
        assert!(
            !required,
            "SPARSE_KNN_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded: put the folder holding \
             libnvrtc.so.13 (pip's nvidia/cu13/lib) on LD_LIBRARY_PATH"
        );
        eprintln!(
            "skipped: libnvrtc cannot be loaded (set SPARSE_KNN_REQUIRE_NVRTC=1 to fail instead)"
        );
        return;
    }
    // Hopper (the device machines) and the oldest architecture CUDA 13 supports.
    for arch in ["compute_90", "compute_75"] {
        let ptx = match kernels::compile(arch) {
            Ok(p) => p,
            Err(e) => panic!("{arch}: {e}"),
        };
        let text = ptx.to_src();
        for name in kernels::kernel_names() {
            assert!(
                text.contains(&format!(".entry {name}(")),
                "{arch}: kernel {name} missing from the PTX"
            );
        }
    }
}
