//! The kernel cache on disk (src/gpu/kernel_cache.rs): its key, its files (written atomically,
//! read back, rejected when damaged), an unwritable folder, and the folder the environment
//! names. Without a GPU, NVRTC compiles a real metric module to a CUBIN (sm_90) that goes through
//! the cache (skipped with a note where libnvrtc cannot be loaded, unless
//! SPARSE_KNN_REQUIRE_NVRTC=1). On a GPU (`--ignored`): a module from the cache gives the answers
//! of a freshly compiled one, and a second process reads it instead of compiling.

use std::path::Path;

use datafusion_sparse_knn::gpu::kernels::cache::{
    self, decode, encode, folder_from, KernelCache, Key, NoFolder, HEADER_BYTES,
};
use datafusion_sparse_knn::gpu::kernels::{self, cached_cubin, Origin};

fn opts(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn key(source: &str) -> Key {
    Key::new(
        source,
        &opts(&["--gpu-architecture=sm_90"]),
        "sm_90",
        "nvrtc 13.0",
    )
}

#[test]
fn the_key_changes_with_source_options_arch_and_toolchain() {
    let o = opts(&["--gpu-architecture=sm_90", "--std=c++17"]);
    let base = Key::new("kernel", &o, "sm_90", "nvrtc 13.0; driver 13000");
    assert_eq!(
        base,
        Key::new("kernel", &o, "sm_90", "nvrtc 13.0; driver 13000")
    );
    let others = [
        Key::new("kernel ", &o, "sm_90", "nvrtc 13.0; driver 13000"),
        Key::new("kernel", &o[..1], "sm_90", "nvrtc 13.0; driver 13000"),
        Key::new(
            "kernel",
            &opts(&["--gpu-architecture=sm_90", "--std=c++20"]),
            "sm_90",
            "nvrtc 13.0; driver 13000",
        ),
        Key::new("kernel", &o, "sm_80", "nvrtc 13.0; driver 13000"),
        Key::new("kernel", &o, "sm_90", "nvrtc 13.1; driver 13000"),
        Key::new("kernel", &o, "sm_90", "nvrtc 13.0; driver 13010"),
        // Parts that run together into the same bytes are still different keys.
        Key::new("kerne", &opts(&["l--gpu-architecture=sm_90"]), "sm_90", ""),
        Key::new("kernel--gpu-architecture=sm_90", &[], "sm_90", ""),
    ];
    for (i, a) in others.iter().enumerate() {
        assert_ne!(*a, base, "{i}");
        for b in &others[i + 1..] {
            assert_ne!(a, b);
        }
    }
    assert_eq!(base.hex().len(), 32);
}

#[test]
fn a_file_is_written_atomically_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    // A folder not made yet: the first store makes it.
    let cache = KernelCache::at(dir.path().join("a/b"));
    let k = key("module");
    assert_eq!(cache.load("cosine", &k), None);
    let cubin: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    assert!(cache.store("cosine", &k, &cubin));
    assert_eq!(cache.load("cosine", &k).as_deref(), Some(&cubin[..]));
    // Replaced in place by a later store.
    assert!(cache.store("cosine", &k, b"other"));
    assert_eq!(cache.load("cosine", &k).as_deref(), Some(&b"other"[..]));
    // One file, named for people, and no temporary left behind.
    let names: Vec<String> = std::fs::read_dir(cache.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, [format!("cosine-{}.cubin", k.hex())]);
    assert_eq!(cache.path("cosine", &k), cache.dir().join(&names[0]));
    // Another key is another file.
    assert_eq!(cache.load("cosine", &key("module 2")), None);
}

#[test]
fn a_damaged_file_is_rejected() {
    let k = key("module");
    let cubin = b"\x7fELF and some machine code".to_vec();
    let whole = encode(&k, &cubin);
    assert_eq!(whole.len(), HEADER_BYTES + cubin.len());
    assert_eq!(decode(&k, &whole), Ok(&cubin[..]));
    // Every truncation, down to nothing.
    for len in 0..whole.len() {
        assert!(decode(&k, &whole[..len]).is_err(), "truncated to {len}");
    }
    // A byte more.
    let mut longer = whole.clone();
    longer.push(0);
    assert!(decode(&k, &longer).is_err());
    // Every single flipped bit of the header but its reserved word, and of the payload.
    for at in (0..whole.len()).filter(|at| !(12..16).contains(at)) {
        for bit in 0..8 {
            let mut bad = whole.clone();
            bad[at] ^= 1 << bit;
            assert!(decode(&k, &bad).is_err(), "byte {at} bit {bit}");
        }
    }
    // Written for another module.
    assert!(decode(&key("other"), &whole)
        .unwrap_err()
        .contains("another module"));

    // In a folder: rejected, then replaced by the next store.
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(dir.path());
    assert!(cache.store("dot", &k, &cubin));
    let path = cache.path("dot", &k);
    std::fs::write(path, &whole[..whole.len() - 3]).unwrap();
    let before = cache::stats().rejected;
    assert_eq!(cache.load("dot", &k), None);
    assert!(cache::stats().rejected > before);
    assert!(cache.store("dot", &k, &cubin));
    assert_eq!(cache.load("dot", &k), Some(cubin));
}

#[test]
fn an_unwritable_folder_is_a_warning_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    // A folder under a plain file cannot be made, even by root (who writes read-only folders).
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let cache = KernelCache::at(file.join("kernels"));
    let k = key("module");
    let before = cache::stats().store_failures;
    assert!(!cache.store("cosine", &k, b"cubin"));
    assert!(cache::stats().store_failures > before);
    assert_eq!(cache.load("cosine", &k), None);
}

/// Writers of the same file at once (as processes compiling the same module are) and readers
/// beside them: every read finds no file or a whole one.
#[test]
fn concurrent_writers_leave_a_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(dir.path());
    let k = key("module");
    let payloads: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 300_000]).collect();
    std::thread::scope(|s| {
        for p in &payloads {
            let cache = &cache;
            s.spawn(move || {
                for _ in 0..20 {
                    assert!(cache.store("cosine", &k, p));
                }
            });
        }
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..200 {
                    if let Ok(bytes) = std::fs::read(cache.path("cosine", &k)) {
                        let cubin = decode(&k, &bytes).expect("a whole file");
                        assert!(payloads.iter().any(|p| p[..] == *cubin));
                    }
                }
            });
        }
    });
    let names = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(names, 1, "no temporary left behind");
}

#[test]
fn the_folder_follows_the_environment() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let all = &[
        ("SPARSE_KNN_KERNEL_CACHE", "/k"),
        ("XDG_CACHE_HOME", "/x"),
        ("HOME", "/h"),
    ];
    assert_eq!(folder_from(env(all)), Ok("/k".into()));
    assert_eq!(
        folder_from(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])),
        Ok("/x/sparse-knn/kernels".into())
    );
    // XDG_CACHE_HOME counts only when absolute; empty variables count as unset.
    assert_eq!(
        folder_from(env(&[
            ("SPARSE_KNN_KERNEL_CACHE", " "),
            ("XDG_CACHE_HOME", "rel"),
            ("HOME", "/h")
        ])),
        Ok("/h/.cache/sparse-knn/kernels".into())
    );
    for off in ["off", "OFF", " off "] {
        let var = move |name: &str| match name {
            "SPARSE_KNN_KERNEL_CACHE" => Some(off.to_string()),
            _ => Some("/h".to_string()),
        };
        assert_eq!(folder_from(var), Err(NoFolder::Off));
    }
    assert_eq!(folder_from(env(&[])), Err(NoFolder::Nowhere));
    assert_eq!(folder_from(env(&[("HOME", "")])), Err(NoFolder::Nowhere));
}

/// Whether NVRTC can be used here; panics when SPARSE_KNN_REQUIRE_NVRTC=1 and it cannot.
fn nvrtc_here() -> bool {
    let required = std::env::var("SPARSE_KNN_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    let present = kernels::nvrtc_available();
    assert!(
        present || !required,
        "SPARSE_KNN_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded"
    );
    if !present {
        eprintln!("skipped: libnvrtc cannot be loaded");
    }
    present
}

fn program(name: &str) -> kernels::MetricProgram {
    kernels::all_programs()
        .into_iter()
        .find(|p| p.name == name)
        .expect("a metric of that name")
}

/// A real metric module compiled by NVRTC to a CUBIN (no GPU needed for sm_90) goes through the
/// cache: compiled and kept, then read back the same; damaged, compiled again and replaced; an
/// unwritable folder still gives the compiled module.
#[test]
fn a_metric_module_compiles_to_a_cubin_and_round_trips() {
    if !nvrtc_here() {
        return;
    }
    let p = program("cosine");
    let toolchain = kernels::toolchain();
    assert!(toolchain.starts_with("nvrtc 1"), "{toolchain}");
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(dir.path());
    let get = |cache: &KernelCache, fresh| {
        cached_cubin(&p.source, p.name, "sm_90", &toolchain, Some(cache), fresh).unwrap()
    };
    let (compiled, origin) = get(&cache, false);
    assert_eq!(origin, Origin::Compiled);
    assert_eq!(&compiled[..4], b"\x7fELF", "a CUBIN is an ELF file");
    let (read, origin) = get(&cache, false);
    assert_eq!(origin, Origin::Cache);
    assert_eq!(read, compiled);

    let file = only_file(dir.path());
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let (again, origin) = get(&cache, false);
    assert_eq!((origin, &again), (Origin::Compiled, &compiled));
    assert_eq!(std::fs::read(&file).unwrap(), bytes, "replaced whole");
    // `fresh` (a cached module the driver refused) compiles even with a good file there.
    assert_eq!(get(&cache, true).1, Origin::Compiled);

    // A module compiled with another definition in it is another file.
    let other = program("dot");
    let (_, origin) = cached_cubin(
        &other.source,
        other.name,
        "sm_90",
        &toolchain,
        Some(&cache),
        false,
    )
    .unwrap();
    assert_eq!(origin, Origin::Compiled);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);

    let blocked = dir.path().join(file.file_name().unwrap()).join("sub");
    let (unwritable, origin) = get(&KernelCache::at(blocked), false);
    assert_eq!((origin, &unwritable), (Origin::Compiled, &compiled));
}

fn only_file(dir: &Path) -> std::path::PathBuf {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.pop().unwrap()
}

/// Where the GPU test's child process writes its answers (and, beside them, its cache counts);
/// set only for the child.
const CHILD_OUT: &str = "SPARSE_KNN_KERNEL_CACHE_TEST_OUT";
/// A plain sum, the tensor cores' metric, and a certified one (bounds on the GPU, exact on the
/// host).
const GPU_METRICS: [&str; 3] = ["cosine", "manhattan", "jensenshannon"];

/// The child of [`a_module_from_the_cache_gives_the_answers_of_a_compiled_one`]: joins random
/// rows on the GPU with each of `GPU_METRICS` in a fresh process, and writes the pairs (distances
/// as bits) and what the kernel cache did. Does nothing when run on its own.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_child_process() {
    use datafusion_sparse_knn::cpu::{ProbeOptions, Selection};
    use datafusion_sparse_knn::gpu::{GpuIndex, GpuOptions};
    use datafusion_sparse_knn::metric::Metric;
    use datafusion_sparse_knn::SparseBatch;
    use rand::{Rng, SeedableRng};
    use std::fmt::Write;

    let Ok(out) = std::env::var(CHILD_OUT) else {
        return;
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(35);
    let rows: Vec<Vec<(i32, f32)>> = (0..3000)
        .map(|_| {
            let degree = rng.random_range(1..60);
            let mut columns: Vec<i32> = (0..degree).map(|_| rng.random_range(0..5000)).collect();
            columns.sort_unstable();
            columns.dedup();
            columns
                .into_iter()
                .map(|c| (c, rng.random_range(1..20) as f32))
                .collect()
        })
        .collect();
    let right = SparseBatch::from_rows(rows.iter().map(|r| Some(&r[..])));
    let left = SparseBatch::from_rows(rows[..500].iter().map(|r| Some(&r[..])));
    let mut text = String::new();
    for name in GPU_METRICS {
        let metric = Metric::new(name, None, Some(5000)).unwrap();
        let index = GpuIndex::build(&right, &metric, &GpuOptions::default()).unwrap();
        let pairs = index
            .probe(&left, Selection::Nearest(10), ProbeOptions::default())
            .unwrap();
        assert_eq!(pairs.left.len(), 5000, "{name}");
        let bits: Vec<u64> = pairs.distance.iter().map(|d| d.to_bits()).collect();
        writeln!(text, "{name} {:?} {:?} {bits:?}", pairs.left, pairs.right).unwrap();
    }
    std::fs::write(&out, text).unwrap();
    let s = cache::stats();
    let counts = format!("{} {} {} {}", s.hits, s.misses, s.rejected, s.stored);
    std::fs::write(format!("{out}.counts"), counts).unwrap();
}

/// Processes in turn, as a user's commands are: the first compiles each metric's module and
/// keeps it, the second reads every one from the cache and gives the same answers bit for bit, a
/// damaged file is compiled again and replaced, and with the cache off nothing is read or kept.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_module_from_the_cache_gives_the_answers_of_a_compiled_one() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("kernels");
    let run = |cache: &Path, tag: &str| -> (String, String) {
        let out = dir.path().join(tag);
        let started = std::time::Instant::now();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "nvrtc_compile::kernel_cache::gpu_child_process",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads=1"])
            .env(CHILD_OUT, &out)
            .env(cache::ENV, cache)
            .status()
            .unwrap();
        assert!(status.success(), "{tag}: the child failed");
        let counts = std::fs::read_to_string(out.with_extension("counts")).unwrap();
        eprintln!(
            "{tag}: {:.2} s, cache hits misses rejected stored: {counts}",
            started.elapsed().as_secs_f64()
        );
        (std::fs::read_to_string(out).unwrap(), counts)
    };
    let (compiled, counts) = run(&folder, "cold");
    assert_eq!(counts, "0 3 0 3");
    assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 3);
    let (cached, counts) = run(&folder, "warm");
    assert_eq!(counts, "3 0 0 0", "the second process reads every module");
    assert_eq!(cached, compiled);

    let damaged = std::fs::read_dir(&folder).unwrap().next().unwrap().unwrap();
    let bytes = std::fs::read(damaged.path()).unwrap();
    std::fs::write(damaged.path(), &bytes[..bytes.len() - 100]).unwrap();
    let (mended, counts) = run(&folder, "mended");
    assert_eq!(counts, "2 0 1 1");
    assert_eq!(mended, compiled);
    assert_eq!(std::fs::read(damaged.path()).unwrap(), bytes);

    let (off, counts) = run(Path::new("off"), "off");
    assert_eq!(counts, "0 0 0 0");
    assert_eq!(off, compiled);
}
