//! Compiles every metric's CUDA module with NVRTC (no GPU needed): the generated `MetricDef` of
//! each definition in src/metric, the kernel argument structs with their layout checks
//! (`static_assert`s generated from src/gpu/args.rs), and the generic kernels. A definition whose
//! formula is not valid CUDA, or a layout that drifts, fails CI. Without libnvrtc the test passes
//! with a note, unless SPARSE_KNN_REQUIRE_NVRTC=1 (CI installs pip's nvidia-cuda-nvrtc and sets it).

use datafusion_sparse_knn::gpu::kernels;

#[test]
fn every_metric_module_compiles_with_nvrtc() {
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
    let programs = kernels::all_programs();
    assert_eq!(programs.len(), 17, "one module per metric");
    // Hopper (the device machines) and the oldest architecture CUDA 13 supports.
    for arch in ["compute_90", "compute_75"] {
        for program in &programs {
            let ptx = kernels::compile(&program.source, program.name, arch)
                .unwrap_or_else(|e| panic!("{arch} {}: {e}", program.name));
            let text = ptx.to_src();
            // For a look at the PTX (or `ptxas` on it) without a GPU.
            if let Ok(dir) = std::env::var("SPARSE_KNN_PTX_DIR") {
                let path = std::path::Path::new(&dir).join(format!("{}_{arch}.ptx", program.name));
                std::fs::write(&path, &text).unwrap();
            }
            for name in program.kernel_names() {
                assert!(
                    text.contains(&format!(".entry {name}(")),
                    "{arch} {}: kernel {name} missing from the PTX",
                    program.name
                );
            }
        }
    }
}

/// The layout checks are real: a module whose argument struct disagrees with the Rust one does
/// not compile.
#[test]
fn a_drifted_argument_layout_does_not_compile() {
    if !kernels::nvrtc_available() {
        eprintln!("skipped: libnvrtc cannot be loaded");
        return;
    }
    let program = &kernels::all_programs()[0];
    // Swap the first two fields' C types: `long long l_base` becomes a 4-byte int, shifting
    // every later field.
    let drifted = program
        .source
        .replacen("    long long l_base;", "    int l_base;", 1);
    assert_ne!(
        drifted, program.source,
        "the declaration to alter was not found"
    );
    let err = kernels::compile(&drifted, "drifted", "compute_90")
        .expect_err("a drifted layout must not compile");
    assert!(err.to_string().contains("layout differs"), "{err}");
}
