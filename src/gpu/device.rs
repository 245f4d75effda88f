//! Device discovery, one CUDA context per device, and each metric's module compiled once per
//! device.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUfunction_attribute, CUresult};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream, DriverError, PinnedHostSlice,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use datafusion::common::{exec_datafusion_err, DataFusionError, Result};

use super::kernels::{self, MetricProgram, Origin};

/// The flags of the event a thread waits on for a launch to end: the thread sleeps until the
/// device is done instead of spinning on a core (the default). A server's lookups each waited
/// out their kernels on a core of their own (0.5-1.3 ms a launch against 11M rows), cores that
/// the other clients' statements needed for planning.
pub(crate) const WAITED_EVENT: CUevent_flags = CUevent_flags::CU_EVENT_BLOCKING_SYNC;

/// Turns a driver error into a DataFusion error that says what was being done.
pub(crate) fn cuda_err(what: &str) -> impl FnOnce(DriverError) -> DataFusionError + '_ {
    move |e| {
        if is_sticky(&e) {
            FAULTS.fetch_add(1, Ordering::Relaxed);
            return exec_datafusion_err!(
                "GPU: {what} failed: {e}; the device is reset before its next use (where the \
                 driver allows it)"
            );
        }
        exec_datafusion_err!("GPU: {what} failed: {e}")
    }
}

/// Sticky errors seen so far. After one, every call on that context fails until the context is
/// destroyed; [`device`] then checks its devices and reopens the broken ones.
static FAULTS: AtomicU64 = AtomicU64::new(0);

/// Errors that leave the CUDA context unusable (a kernel fault, not a refused call).
fn is_sticky(e: &DriverError) -> bool {
    matches!(
        e.0,
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
            | CUresult::CUDA_ERROR_LAUNCH_FAILED
            | CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUresult::CUDA_ERROR_MISALIGNED_ADDRESS
            | CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUresult::CUDA_ERROR_INVALID_PC
            | CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUresult::CUDA_ERROR_ASSERT
            | CUresult::CUDA_ERROR_LAUNCH_TIMEOUT
            | CUresult::CUDA_ERROR_ECC_UNCORRECTABLE
    )
}

/// Whether an error is the driver running out of device memory (a smaller chunk may fit).
pub(crate) fn is_out_of_memory(e: &DataFusionError) -> bool {
    e.to_string().contains("OUT_OF_MEMORY")
}

/// Each metric's module (keyed by a hash of its source): the loaded module or why it failed.
type ModuleCache = HashMap<u64, std::result::Result<Arc<CudaModule>, String>>;

/// Kernels cached per (module, name), with the most dynamic shared memory each was allowed.
type FunctionCache = HashMap<(u64, &'static str), (CudaFunction, u32)>;

/// One GPU: its context, the stream builds run on, and its properties. A probe runs on one of
/// the device's lanes: this stream, or one of `extra_lanes` (a `Device` each, sharing the context
/// and kernels, with a stream of its own), so that one probe's host steps and copies overlap
/// another's kernels.
pub(crate) struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub ordinal: usize,
    pub name: String,
    pub sm_count: u32,
    /// Largest dynamic shared memory one block may opt into.
    pub smem_optin: u32,
    pub smem_per_sm: u32,
    pub arch: String,
    /// Tensor cores with TF32, half and 8-bit products (compute capability 8.0 or later): the
    /// dense columns of dot and cosine go through `dense_gemm`.
    pub tensor_cores: bool,
    modules: Arc<Mutex<ModuleCache>>,
    functions: Arc<Mutex<FunctionCache>>,
    extra_lanes: Vec<Device>,
    /// This lane's pinned buffers for large uploads, made on the first.
    staging: Mutex<Option<Staging>>,
    /// Which lanes are taken (0: this device's own stream), and builds waiting for all of them.
    lanes: Mutex<LaneState>,
    lane_freed: Condvar,
}

struct LaneState {
    busy: Vec<bool>,
    builds_waiting: usize,
}

/// A lane's staging buffers, held until dropped.
pub(crate) struct StagingGuard<'a>(MutexGuard<'a, Option<Staging>>);

impl std::ops::Deref for StagingGuard<'_> {
    type Target = Staging;
    fn deref(&self) -> &Staging {
        self.0
            .as_ref()
            .expect("staging made before the guard is handed out")
    }
}

impl std::ops::DerefMut for StagingGuard<'_> {
    fn deref_mut(&mut self) -> &mut Staging {
        self.0
            .as_mut()
            .expect("staging made before the guard is handed out")
    }
}

/// Lanes a probe or a build holds until dropped.
pub(crate) struct Lanes<'a> {
    device: &'a Device,
    held: Vec<usize>,
}

impl Lanes<'_> {
    /// The device as seen from the first lane held (its stream is the lane's).
    pub fn device(&self) -> &Device {
        match self.held[0] {
            0 => self.device,
            i => &self.device.extra_lanes[i - 1],
        }
    }

    /// How many probes' scratch may share the device's memory budget with this holder's: one
    /// when it holds every lane, else one per lane.
    pub fn sharing_budget(&self) -> u64 {
        match self.held.len() {
            n if n == self.device.lane_count() => 1,
            _ => self.device.lane_count() as u64,
        }
    }
}

impl Drop for Lanes<'_> {
    fn drop(&mut self) {
        let mut state = self.device.lane_state();
        for &i in &self.held {
            state.busy[i] = false;
        }
        drop(state);
        self.device.lane_freed.notify_all();
    }
}

/// Two pinned host buffers a lane copies large uploads through, each with the event of its last
/// copy.
pub(crate) struct Staging {
    buffers: [(PinnedHostSlice<u8>, CudaEvent); 2],
}

impl Staging {
    /// Bytes each buffer holds.
    pub fn chunk_bytes(&self) -> usize {
        self.buffers[0].0.len()
    }

    pub fn buffer(&mut self, i: usize) -> (&mut PinnedHostSlice<u8>, &CudaEvent) {
        let (buffer, copied) = &mut self.buffers[i];
        (buffer, copied)
    }
}

/// Each staging buffer's size, and the least upload that goes through them:
/// `SPARSE_KNN_STAGE_BYTES` (tests lower it so that every upload is staged in many pieces),
/// default 8 MiB.
pub(crate) fn stage_bytes() -> usize {
    static BYTES: OnceLock<usize> = OnceLock::new();
    *BYTES.get_or_init(|| {
        std::env::var("SPARSE_KNN_STAGE_BYTES")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(8 << 20)
    })
}

/// Probes one GPU runs at once: `SPARSE_KNN_GPU_LANES` (1 to 4), default 2.
fn configured_lanes() -> usize {
    static LANES: OnceLock<usize> = OnceLock::new();
    *LANES.get_or_init(|| {
        std::env::var("SPARSE_KNN_GPU_LANES")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(2, |n| n.clamp(1, 4))
    })
}

impl Drop for Device {
    /// The staging buffers' pinned memory is freed with the fields, after this: the driver frees
    /// it in the current context, which the thread dropping the device may not have bound.
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GPU {} ({}, {}, {} SMs)",
            self.ordinal, self.name, self.arch, self.sm_count
        )
    }
}

/// Calls into the driver, turning cudarc's panic on a missing library into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => Err(exec_datafusion_err!(
            "GPU: {what}: the CUDA driver library could not be used"
        )),
    }
}

/// Number of CUDA devices, or an error saying why none can be used.
pub(crate) fn device_count() -> Result<usize> {
    static COUNT: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    COUNT
        .get_or_init(|| {
            // SAFETY: only tries to dlopen the candidate library names.
            if !unsafe { cudarc::driver::sys::is_culib_present() } {
                return Err("no CUDA driver (libcuda.so) found".to_string());
            }
            guarded("device discovery", || {
                CudaContext::device_count().map_err(cuda_err("listing CUDA devices"))
            })
            .map_err(|e| e.to_string())
            .and_then(|n| {
                if n > 0 {
                    Ok(n as usize)
                } else {
                    Err("the CUDA driver reports no device".to_string())
                }
            })
        })
        .clone()
        .map_err(|e| exec_datafusion_err!("GPU: {e}"))
}

/// A device opened on first use (or why it could not be), and the fault count it was last
/// checked at.
#[derive(Default)]
struct DeviceSlot {
    opened: Option<std::result::Result<Arc<Device>, String>>,
    checked_at_fault: u64,
}

/// Every device's slot, made on the first [`device`] call.
static DEVICES: OnceLock<Vec<Mutex<DeviceSlot>>> = OnceLock::new();

/// The device with this ordinal, its context created on first use. When an earlier query left it
/// broken (a sticky error: see [`FAULTS`]) and nothing uses it any more, its primary context is
/// reset and opened again; where the driver refuses that (it documents a kernel fault as fatal
/// to the process: the H200's driver keeps answering ILLEGAL_ADDRESS after the reset), the device
/// is refused from then on with a reason, and `device=auto` runs on the CPU.
pub(crate) fn device(ordinal: usize) -> Result<Arc<Device>> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(exec_datafusion_err!(
            "GPU: no device {ordinal} ({count} found)"
        ));
    }
    let slots = DEVICES.get_or_init(|| (0..count).map(|_| Mutex::default()).collect());
    let mut slot = slots[ordinal].lock().unwrap_or_else(|e| e.into_inner());
    let faults = FAULTS.load(Ordering::Relaxed);
    if let Some(Ok(dev)) = &slot.opened {
        if slot.checked_at_fault != faults {
            if let Err(e) = dev.health() {
                if Arc::strong_count(dev) > 1 {
                    // Indexes of running queries still hold the broken context; destroying it
                    // under them would free memory they point at.
                    return Err(exec_datafusion_err!(
                        "GPU {ordinal} stopped after a CUDA error ({e}); it is reopened once \
                         the queries still using it end"
                    ));
                }
                log::warn!("GPU {ordinal}: reopening the device after a CUDA error ({e})");
                // The last reference: dropping it releases our hold on the primary context; the
                // reset then destroys it (a sticky error survives a plain release), and the next
                // open starts a clean one.
                slot.opened = None;
                reset_primary_context(ordinal)?;
            }
            slot.checked_at_fault = faults;
        }
    }
    let opened = match slot.opened.take() {
        Some(o) => o,
        None => open(ordinal).map(Arc::new).map_err(|e| {
            if faults == 0 {
                e.to_string()
            } else {
                format!(
                    "GPU {ordinal} cannot be used again in this process: after a kernel fault \
                     the CUDA driver refuses new work on it even after a reset ({}); restart the \
                     process to use it (device=auto runs on the CPU meanwhile)",
                    e.strip_backtrace()
                )
            }
        }),
    };
    slot.opened = Some(opened.clone());
    opened.map_err(|e| exec_datafusion_err!("{e}"))
}

/// Closes every opened device that no index uses any more, destroying its context (its
/// modules, stream and memory pool), and returns how many it closed. A command that is done with
/// the GPU calls it while it finishes its output: the driver's teardown (about 0.1 s) then
/// overlaps that work instead of following it at the process's exit. A later [`device`] call
/// opens the device again.
pub(crate) fn close_unused() -> usize {
    let Some(slots) = DEVICES.get() else {
        return 0;
    };
    let mut closed = 0;
    for slot in slots {
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(&slot.opened, Some(Ok(dev)) if Arc::strong_count(dev) == 1) {
            // The last reference: dropping it releases the primary context, which the driver
            // then destroys (nothing else of this process retains it).
            slot.opened = None;
            closed += 1;
        }
    }
    closed
}

/// Destroys the device's primary context with everything in it (nothing of ours uses it any
/// more), clearing a sticky error.
fn reset_primary_context(ordinal: usize) -> Result<()> {
    guarded("resetting the device", || {
        let dev = cudarc::driver::result::device::get(ordinal as i32)
            .map_err(cuda_err("finding the device"))?;
        // SAFETY: the last `Device` of this ordinal is gone, so no buffer, module or stream of
        // this crate refers to the context being reset.
        unsafe { cudarc::driver::sys::cuDevicePrimaryCtxReset_v2(dev) }
            .result()
            .map_err(cuda_err("resetting the device's context"))
    })
}

fn open(ordinal: usize) -> Result<Device> {
    guarded("opening the device", || {
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("creating a CUDA context"))?;
        // Streams used in order, each by one probe or build at a time, and cudarc's per-buffer
        // event tracking not needed: a buffer is written and read on the stream it was made on,
        // except the right side's, which a build writes and synchronizes before any probe (on
        // any lane) reads it, and which is dropped only after every probe is done.
        // SAFETY: as above.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(cuda_err("creating a CUDA stream"))?;
        let attr = |a| {
            ctx.attribute(a)
                .map_err(cuda_err("reading a device attribute"))
        };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(cuda_err("reading the compute capability"))?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".to_string());
        let sm_count = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let smem_optin =
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as u32;
        let smem_per_sm =
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?
                as u32;
        let modules: Arc<Mutex<ModuleCache>> = Arc::default();
        let functions: Arc<Mutex<FunctionCache>> = Arc::default();
        // A lane with its own stream and the device's kernels; `lanes`: how many the device
        // hands out (none for the extra lanes themselves).
        let lane = |stream: Arc<CudaStream>, lanes: usize| Device {
            name: name.clone(),
            sm_count,
            smem_optin,
            smem_per_sm,
            arch: arch_name(major, minor),
            tensor_cores: major >= 8,
            ctx: Arc::clone(&ctx),
            stream,
            ordinal,
            modules: Arc::clone(&modules),
            functions: Arc::clone(&functions),
            extra_lanes: Vec::new(),
            staging: Mutex::new(None),
            lanes: Mutex::new(LaneState {
                busy: vec![false; lanes],
                builds_waiting: 0,
            }),
            lane_freed: Condvar::new(),
        };
        let mut device = lane(stream, configured_lanes());
        for _ in 1..configured_lanes() {
            let stream = ctx
                .new_stream()
                .map_err(cuda_err("creating a CUDA stream"))?;
            device.extra_lanes.push(lane(stream, 0));
        }
        Ok(device)
    })
}

impl Device {
    fn lane_state(&self) -> MutexGuard<'_, LaneState> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This lane's staging buffers (see [`Staging`]), made on first use.
    pub fn staging(&self) -> Result<StagingGuard<'_>> {
        let mut slot = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            let buffer = || -> Result<(PinnedHostSlice<u8>, CudaEvent)> {
                // SAFETY: the buffer is only read by copies of bytes written into it first.
                let pinned = unsafe { self.ctx.alloc_pinned::<u8>(stage_bytes()) }
                    .map_err(cuda_err("allocating pinned host memory"))?;
                let copied = self
                    .ctx
                    .new_event(None)
                    .map_err(cuda_err("creating an event"))?;
                Ok((pinned, copied))
            };
            *slot = Some(Staging {
                buffers: [buffer()?, buffer()?],
            });
        }
        Ok(StagingGuard(slot))
    }

    /// How many probes can run at once on this device.
    pub fn lane_count(&self) -> usize {
        1 + self.extra_lanes.len()
    }

    /// One free lane for a probe, waiting for one (and for any build waiting for all).
    pub fn take_lane(&self) -> Lanes<'_> {
        let mut state = self.lane_state();
        loop {
            if state.builds_waiting == 0 {
                if let Some(i) = state.busy.iter().position(|b| !b) {
                    state.busy[i] = true;
                    return Lanes {
                        device: self,
                        held: vec![i],
                    };
                }
            }
            state = self
                .lane_freed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Every lane (lane 0 first), waiting until no probe runs: a build reads the free memory
    /// and uploads with no probe's scratch beside it, and a probe that streams the right side's
    /// parts runs alone.
    pub fn take_all_lanes(&self) -> Lanes<'_> {
        let mut state = self.lane_state();
        state.builds_waiting += 1;
        while state.busy.iter().any(|&b| b) {
            state = self
                .lane_freed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        state.builds_waiting -= 1;
        state.busy.iter_mut().for_each(|b| *b = true);
        Lanes {
            device: self,
            held: (0..state.busy.len()).collect(),
        }
    }

    /// Whether the context still works: a sticky error from any earlier call is returned by
    /// every later one, a synchronize included.
    fn health(&self) -> std::result::Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        self.stream.synchronize()
    }

    /// The module of `program` for this device's architecture, loaded on first use: from the
    /// kernel cache on disk, or compiled with NVRTC. A cached module the driver refuses is
    /// compiled again, replaced in the cache, and loaded.
    fn module(&self, key: u64, program: &MetricProgram) -> Result<Arc<CudaModule>> {
        let mut modules = self
            .modules
            .lock()
            .map_err(|_| exec_datafusion_err!("GPU: a probe panicked"))?;
        modules
            .entry(key)
            .or_insert_with(|| {
                let load = |ptx: Ptx| {
                    guarded("loading the kernels", || {
                        self.ctx
                            .load_module(ptx)
                            .map_err(cuda_err("loading the compiled kernels"))
                    })
                };
                let (ptx, origin) = compiled(key, program, &self.arch)?;
                let started = std::time::Instant::now();
                let module = match load(ptx) {
                    Err(e) if origin == Origin::Cache => {
                        kernels::cache::count_refused();
                        log::warn!(
                            "GPU {}: the cached {} kernels do not load ({e}); compiling them \
                             again",
                            self.ordinal,
                            program.name
                        );
                        let (cubin, _) =
                            cubin_for(program, &self.arch, true).map_err(|e| e.to_string())?;
                        load(Ptx::from_binary(cubin))
                    }
                    loaded => loaded,
                };
                log::debug!(
                    "GPU {}: {} module ({origin:?}) loaded in {:?}",
                    self.ordinal,
                    program.name,
                    started.elapsed()
                );
                module.map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| exec_datafusion_err!("{e}"))
    }

    /// Compiles and loads `program`'s module now (a warm-up ahead of the first probe).
    pub fn load(&self, program: &MetricProgram) -> Result<()> {
        self.module(source_key(program), program).map(|_| ())
    }

    /// Kernel `name` of `program`'s module, allowed `smem` bytes of dynamic shared memory.
    pub fn function(
        &self,
        program: &MetricProgram,
        name: &'static str,
        smem: u32,
    ) -> Result<CudaFunction> {
        let key = source_key(program);
        let module = self.module(key, program)?;
        let mut cache = self
            .functions
            .lock()
            .map_err(|_| exec_datafusion_err!("GPU: a probe panicked"))?;
        let (f, allowed) = match cache.get_mut(&(key, name)) {
            Some(entry) => entry,
            None => {
                let f = module
                    .load_function(name)
                    .map_err(cuda_err("finding a kernel"))?;
                cache.entry((key, name)).or_insert((f, 0))
            }
        };
        // Only ever raised: a probe on another lane may be about to launch this kernel with
        // the larger amount it was allowed.
        if smem > *allowed || *allowed == 0 {
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(cuda_err("raising a kernel's shared-memory limit"))?;
            *allowed = smem.max(*allowed);
        }
        Ok(f.clone())
    }

    /// Free and total device memory.
    pub fn memory(&self) -> Result<(u64, u64)> {
        let (free, total) = self
            .ctx
            .mem_get_info()
            .map_err(cuda_err("reading free device memory"))?;
        Ok((free as u64, total as u64))
    }
}

/// Compiles `program` for GPU `ordinal`'s architecture without its context: NVRTC needs only
/// the compute capability, which the driver answers right after `cuInit`, so the compile runs
/// beside the context's creation (0.1-0.2 s on the H100s and H200s measured) instead of after it.
/// The device's [`Device::load`] then finds the module done, or waits for it.
pub(crate) fn compile_ahead(ordinal: usize, program: &MetricProgram) -> Result<()> {
    let arch = guarded("reading the compute capability", || {
        let dev = cudarc::driver::result::device::get(ordinal as i32)
            .map_err(cuda_err("finding the device"))?;
        let attr = |a| {
            // SAFETY: `dev` is a device handle the driver just returned.
            unsafe { cudarc::driver::result::device::get_attribute(dev, a) }
                .map_err(cuda_err("reading a device attribute"))
        };
        let major = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Ok(arch_name(major, minor))
    })?;
    compiled(source_key(program), program, &arch)
        .map(|_| ())
        .map_err(|e| exec_datafusion_err!("{e}"))
}

/// NVRTC's name of an architecture.
fn arch_name(major: i32, minor: i32) -> String {
    format!("compute_{major}{minor}")
}

/// The module cache's key: a hash of the program's source.
fn source_key(program: &MetricProgram) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    program.source.hash(&mut h);
    h.finish()
}

/// `program`'s machine code for `arch` (`compute_XY`: compiled for `sm_XY`), once per process,
/// from the kernel cache or NVRTC ([`kernels::cached_cubin`]): GPUs of one architecture share it
/// (each loads it into its own context), and a second GPU waits for the first one's instead of
/// running NVRTC again.
fn compiled(
    key: u64,
    program: &MetricProgram,
    arch: &str,
) -> std::result::Result<(Ptx, Origin), String> {
    type Slot = Arc<OnceLock<std::result::Result<(Ptx, Origin), String>>>;
    static PTX: OnceLock<Mutex<HashMap<(u64, String), Slot>>> = OnceLock::new();
    let slot: Slot = PTX
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry((key, arch.to_string()))
        .or_default()
        .clone();
    slot.get_or_init(|| {
        cubin_for(program, arch, false)
            .map(|(cubin, origin)| (Ptx::from_binary(cubin), origin))
            .map_err(|e| e.to_string())
    })
    .clone()
}

/// `program`'s CUBIN for `arch` from the kernel cache of this process's environment, or
/// compiled (`fresh`: compiled, the cache not read; see [`kernels::cached_cubin`]).
fn cubin_for(program: &MetricProgram, arch: &str, fresh: bool) -> Result<(Vec<u8>, Origin)> {
    let sm = arch.replacen("compute_", "sm_", 1);
    let cache = kernels::cache::KernelCache::from_env();
    kernels::cached_cubin(
        &program.source,
        program.name,
        &sm,
        &kernels::toolchain(),
        cache.as_ref(),
        fresh,
    )
}

/// Makes a kernel fault on GPU `ordinal` (a write to an invalid address), leaving its context
/// broken as a faulty kernel would: for tests of the recovery in [`device`].
#[doc(hidden)]
pub fn fault_for_tests(ordinal: usize) -> Result<()> {
    const SOURCE: &str = r#"extern "C" __global__ void fault(unsigned long long address) {
        *(volatile int*)address = 1;
    }"#;
    let dev = device(ordinal)?;
    let ptx = kernels::compile(SOURCE, "fault", &dev.arch)?;
    let module = dev
        .ctx
        .load_module(ptx)
        .map_err(cuda_err("loading the fault kernel"))?;
    let f = module
        .load_function("fault")
        .map_err(cuda_err("finding the fault kernel"))?;
    let address: u64 = 8;
    let mut launch = dev.stream.launch_builder(&f);
    launch.arg(&address);
    // SAFETY: the kernel is meant to fault; the driver catches it and reports an error.
    unsafe { launch.launch(cudarc::driver::LaunchConfig::for_num_elems(1)) }
        .map_err(cuda_err("launching the fault kernel"))?;
    dev.stream
        .synchronize()
        .map_err(cuda_err("running the fault kernel"))
}
