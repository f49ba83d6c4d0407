"""Can an FP32 add (main += buf, 8192x8192, 805 MB of traffic) overlap BF16 GEMMs (8192x8192x4096) on
an H200, and how does the side stream's priority change it? Medians of 10 after 3 warm-ups."""
import json, statistics, sys, torch
torch.manual_seed(0)
M = N = 8192; K = 4096
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
main = torch.zeros(M, N, device="cuda"); buf = torch.randn(M, N, device="cuda")
lo, hi = torch.cuda.Stream.priority_range()
res = {"priority_range": [lo, hi], "torch": torch.__version__}
def timed(fn, reps=10):
    for _ in range(3): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)
def gemms(n=8):
    for _ in range(n): torch.mm(a, b, out=c)
def adds(n=8):
    for _ in range(n): main.add_(buf)
res["gemm_x8_ms"] = timed(gemms); res["add_x8_ms"] = timed(adds)
res["serial_ms"] = timed(lambda: (gemms(), adds()))
for name, prio in (("side_low", lo), ("side_high", hi)):
    side = torch.cuda.Stream(priority=prio)
    def both():
        cur = torch.cuda.current_stream(); side.wait_stream(cur)
        with torch.cuda.stream(side): adds()
        gemms(); cur.wait_stream(side)
    res[name + "_concurrent_ms"] = timed(both)
    # Interleaved as libgtp issues them: one add per GEMM, each after the GEMM before it.
    def inter():
        cur = torch.cuda.current_stream()
        for i in range(8):
            torch.mm(a, b, out=c)
            ev = torch.cuda.Event(); ev.record(cur); side.wait_event(ev)
            with torch.cuda.stream(side): main.add_(buf)
        cur.wait_stream(side)
    res[name + "_interleaved_ms"] = timed(inter)
for p in ("low", "high"):
    res["exposed_fraction_" + p] = (res[f"side_{p}_interleaved_ms"] - res["gemm_x8_ms"]) / res["add_x8_ms"]
print(json.dumps(res, indent=1))
json.dump(res, open(sys.argv[1], "w"), indent=1)
