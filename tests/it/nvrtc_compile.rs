//! Compiles every metric's CUDA module with NVRTC (no GPU needed): the generated `MetricDef` of
//! each definition in src/metric, the kernel argument structs with their layout checks
//! (`static_assert`s generated from src/gpu/args.rs), and the generic kernels. A definition whose
//! formula is not valid CUDA, or a layout that drifts, fails CI. Without libnvrtc the test passes
//! with a note, unless SPARSE_KNN_REQUIRE_NVRTC=1 (CI installs pip's nvidia-cuda-nvrtc and sets it).

/// The compiled kernels' cache on disk (a module of this binary: one link less).
#[path = "nvrtc/kernel_cache.rs"]
mod kernel_cache;

use std::sync::OnceLock;

use datafusion_sparse_knn::gpu::kernels;

/// Every metric's module compiled for Hopper, (name, PTX), once for the tests that read it: NVRTC
/// takes about a second a module.
fn hopper_ptx() -> &'static [(&'static str, String)] {
    static PTX: OnceLock<Vec<(&'static str, String)>> = OnceLock::new();
    PTX.get_or_init(|| {
        kernels::all_programs()
            .iter()
            .map(|program| {
                let ptx = kernels::compile(&program.source, program.name, "compute_90")
                    .unwrap_or_else(|e| panic!("compute_90 {}: {e}", program.name));
                (program.name, ptx.to_src())
            })
            .collect()
    })
}

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
        for (i, program) in programs.iter().enumerate() {
            let text = match arch {
                "compute_90" => hopper_ptx()[i].1.clone(),
                _ => kernels::compile(&program.source, program.name, arch)
                    .unwrap_or_else(|e| panic!("{arch} {}: {e}", program.name))
                    .to_src(),
            };
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

/// ptxas's report for one kernel: (registers, bytes of spill stores).
fn ptxas_report(log: &str, kernel: &str) -> (u32, u32) {
    // From this kernel's heading to the next kernel's.
    let head = format!("Compiling entry function '{kernel}'");
    let at = log
        .find(&head)
        .unwrap_or_else(|| panic!("ptxas said nothing of {kernel}:\n{log}"));
    let rest = &log[at + head.len()..];
    let block = &rest[..rest.find("Compiling entry function").unwrap_or(rest.len())];
    let number_before = |text: &str, marker: &str| -> u32 {
        let at = text
            .find(marker)
            .unwrap_or_else(|| panic!("no `{marker}` for {kernel}:\n{text}"));
        let digits: String = text[..at]
            .trim_end()
            .chars()
            .rev()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.chars().rev().collect::<String>().parse().unwrap()
    };
    (
        number_before(block, "registers"),
        number_before(block, "bytes spill stores"),
    )
}

/// The metrics whose folded kernels are compiled for four blocks a SM
/// (`kernels::folded_min_blocks`) fit the 32 registers that takes with at most one spilled word:
/// more would put the walk's registers in local memory, slower than the three blocks the
/// compiler's own choice runs. (At this bound ptxas keeps some radius kernels' per-thread
/// shared-memory address in local memory, 4 bytes, reloaded once per chunk of left nonzeros.)
/// The lifted metrics, compiled for three blocks, fit its 40 registers with at most 32 bytes
/// spilled.
/// Needs ptxas (pip's nvidia-cuda-nvcc), named by SPARSE_KNN_PTXAS; CI sets it and
/// SPARSE_KNN_REQUIRE_PTXAS=1, without which a missing ptxas skips with a note.
#[test]
fn four_block_folded_kernels_fit_32_registers() {
    let required = std::env::var("SPARSE_KNN_REQUIRE_PTXAS").is_ok_and(|v| v == "1");
    let ptxas = std::env::var("SPARSE_KNN_PTXAS").ok();
    let (Some(ptxas), true) = (ptxas, kernels::nvrtc_available()) else {
        assert!(
            !required,
            "SPARSE_KNN_REQUIRE_PTXAS=1 but SPARSE_KNN_PTXAS (pip's nvidia/cu13/bin/ptxas) is not \
             set or libnvrtc cannot be loaded"
        );
        eprintln!("skipped: no ptxas (set SPARSE_KNN_PTXAS) or no libnvrtc");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut bounded = 0;
    for (name, ptx) in hopper_ptx() {
        let blocks = kernels::folded_min_blocks(name);
        let path = dir.path().join(format!("{name}.ptx"));
        std::fs::write(&path, ptx).unwrap();
        let out = std::process::Command::new(&ptxas)
            .args(["-arch=sm_90", "-v", "-o"])
            .arg(dir.path().join("out.cubin"))
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("running {ptxas}: {e}"));
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "ptxas failed on {}:\n{log}", name);
        for kernel in ["folded_knn", "folded_radius"] {
            let (registers, spills) = ptxas_report(&log, kernel);
            if blocks == 4 {
                assert!(
                    registers <= 32 && spills <= 4,
                    "{} {kernel}: {registers} registers, {spills} bytes spilled under a bound of \
                     four blocks of 512 (take it off FOUR_BLOCK_METRICS in src/gpu/kernels.rs)",
                    name
                );
            } else if blocks == 3 {
                // (jensenshannon spills 24-32 bytes here and was still measured the faster;
                // more would be a different kernel, to measure again)
                assert!(
                    registers <= 40 && spills <= 32,
                    "{} {kernel}: {registers} registers, {spills} bytes spilled under a bound of \
                     three blocks of 512 (see THREE_BLOCK_METRICS in src/gpu/kernels.rs)",
                    name
                );
            } else {
                // Unbounded, the compiler keeps more than 32: the bound would be the one change.
                assert!(registers > 32, "{} {kernel}: {registers} registers", name);
            }
        }
        bounded += usize::from(blocks == 4);
    }
    assert!(
        bounded >= 11,
        "the cheap metrics run four blocks a SM ({bounded})"
    );
}
