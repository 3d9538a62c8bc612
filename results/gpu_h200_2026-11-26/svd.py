"""Where cuSOLVER's 32-bit gesvd (torch.linalg.svdvals(driver="gesvd") on CUDA) stops, and what
the CPU fallback costs at WikiText-2's n = 33,278."""
import subprocess, sys, time
import torch

LIMITS = {}

def buffer_limit():
    try:
        import cupy
        try:
            from cupy_backends.cuda.libs import cusolver
        except ImportError:
            from cupy.cuda import cusolver
        handle = cupy.cuda.device.get_cusolver_handle()
    except Exception as e:
        print("cupy route failed:", repr(e)); return
    for name in ("sgesvd_bufferSize", "dgesvd_bufferSize"):
        f = getattr(cusolver, name)
        def ok(n):
            try:
                f(handle, n, n); return True
            except Exception:
                return False
        print(name, "n=10000", ok(10000), "n=33278", ok(33278), flush=True)
        lo, hi = 10000, 40000
        if not ok(lo) or ok(hi):
            continue
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        LIMITS[name] = lo
        try:
            print(name, "largest n:", lo, "lwork", f(handle, lo, lo), flush=True)
        except Exception as e:
            print(name, lo, e)

def torch_at(n, device, dtype=torch.float32, driver=None):
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device, dtype=dtype).triu_()
    t = time.time()
    try:
        s = torch.linalg.svdvals(a, driver=driver) if driver else torch.linalg.svdvals(a)
        if device == "cuda": torch.cuda.synchronize()
        print(f"{device} {dtype} n={n} driver={driver}: {time.time() - t:.1f} s, max {s.max().item():.1f}", flush=True)
    except Exception as e:
        print(f"{device} {dtype} n={n} driver={driver}: error {str(e)[:160]}", flush=True)

if __name__ == "__main__":
    what = sys.argv[1]
    if what == "limit":
        buffer_limit()
        n = LIMITS.get("sgesvd_bufferSize", 32767)
        torch_at(n + 1, "cuda", driver="gesvd")     # expected: the bufferSize error, at once
        torch_at(n, "cuda", driver="gesvd")
    elif what == "cpu":
        torch.set_num_threads(16)
        torch_at(33278, "cpu")
