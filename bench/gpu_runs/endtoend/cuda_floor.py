"""The CUDA driver's fixed cost to a process, with nothing of ours: what a fresh `knn` on the GPU
pays that `bench`'s warm best-of-3 does not. Run as `python3 cuda_floor.py child STEPS` (one
process that does STEPS and exits) or `python3 cuda_floor.py` (times each variant, 3 rounds,
by the parent's wall clock around the whole child process, its start and exit included).
STEPS: none (an empty Python process), init (cuInit), ctx (cuInit and the primary context),
mem (ctx and 300 MB of device memory written), destroy (mem, then the memory freed and the
context released before the exit)."""
import ctypes, subprocess, sys, time

def child(steps):
    t0 = time.perf_counter()
    marks = []
    if steps == "none":
        return
    cuda = ctypes.CDLL("libcuda.so.1")
    ok = lambda r, what: r == 0 or sys.exit(f"{what}: CUDA error {r}")
    ok(cuda.cuInit(0), "cuInit")
    marks.append(("cuInit", time.perf_counter() - t0))
    if steps == "init":
        print(" ".join(f"{k}={v*1e3:.1f}ms" for k, v in marks), file=sys.stderr)
        return
    dev = ctypes.c_int()
    ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    ok(cuda.cuCtxSetCurrent(ctx), "set current")
    ptr = ctypes.c_uint64()
    ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)), "alloc")
    ok(cuda.cuCtxSynchronize(), "sync")
    marks.append(("context", time.perf_counter() - t0))
    if steps in ("mem", "destroy"):
        big = ctypes.c_uint64()
        ok(cuda.cuMemAlloc_v2(ctypes.byref(big), ctypes.c_size_t(300 << 20)), "alloc 300 MB")
        ok(cuda.cuMemsetD8_v2(big, ctypes.c_ubyte(1), ctypes.c_size_t(300 << 20)), "memset")
        ok(cuda.cuCtxSynchronize(), "sync")
        marks.append(("memory", time.perf_counter() - t0))
    if steps == "destroy":
        ok(cuda.cuDevicePrimaryCtxRelease_v2(dev), "release")
        marks.append(("released", time.perf_counter() - t0))
    print(" ".join(f"{k}={v*1e3:.1f}ms" for k, v in marks), file=sys.stderr)

if len(sys.argv) > 1 and sys.argv[1] == "child":
    child(sys.argv[2])
    sys.exit(0)

for rnd in range(3):
    for steps in ("none", "init", "ctx", "mem", "destroy"):
        t = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, "child", steps], capture_output=True, text=True)
        wall = time.perf_counter() - t
        print(f"round {rnd + 1} {steps:8s} wall {wall * 1e3:7.1f} ms  {p.stderr.strip()}", flush=True)
