#!/usr/bin/env python3
"""The torch.compile peer of gtp-kernel-bench: the same quantizations (FP8 per-tensor, MXFP8 RCEIL,
NVFP4 1D) and dequantizations written in PyTorch and compiled with torch.compile, timed on the same
shard sizes (BF16 [rows, 4096]) with CUDA events, median after warm-up, rotating inputs past L2.

Writes JSON with the same fields as gtp-kernel-bench (bytes = input read + output written).
usage: torch_quant_peer.py [--sizes-mib 4,16,64,256] [--iters N] [--json FILE]
"""
import argparse
import json
import statistics

import torch

COLS = 4096
MIB = 1 << 20
ROTATION_BYTES = 512 * MIB
E2M1_THRESHOLDS = None


def fp8_pack(x):
    amax = x.float().abs().amax()
    scale = torch.where(amax > 0, 448.0 / amax, torch.ones_like(amax))
    q = (x.float() * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q, 1.0 / scale


def fp8_unpack(q, scale_inv):
    return (q.float() * scale_inv).to(torch.bfloat16)


def mxfp8_pack(x):
    blocks = x.float().view(-1, 32)
    amax = blocks.abs().amax(dim=1, keepdim=True)
    # RCEIL: the power of two at or above amax / 448.
    exponent = torch.ceil(torch.log2(amax * (1.0 / 448.0))).clamp(-127, 127)
    exponent = torch.where(amax > 0, exponent, torch.full_like(exponent, -127))
    q = (blocks * torch.exp2(-exponent)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(x.shape), (exponent + 127).to(torch.uint8)


def mxfp8_unpack(q, e8m0):
    scale = torch.exp2(e8m0.float() - 127.0)
    return (q.float().view(-1, 32) * scale).to(torch.bfloat16).view(q.shape)


def e2m1_codes(y):
    a = y.abs()
    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=y.device)
    code = torch.bucketize(a, bounds, right=False).to(torch.uint8)
    return code | (torch.signbit(y).to(torch.uint8) << 3)


def nvfp4_pack(x):
    xf = x.float()
    global_amax = xf.abs().amax()
    s_enc = torch.where(global_amax > 0, 2688.0 / global_amax, torch.ones_like(global_amax))
    s_dec = 1.0 / s_enc
    blocks = xf.view(-1, 16)
    amax = blocks.abs().amax(dim=1, keepdim=True)
    s_b = (amax * (s_enc / 6.0)).clamp(max=448.0).to(torch.float8_e4m3fn)
    c = (1.0 / (s_b.float() * s_dec)).clamp(max=3.4e38)
    codes = e2m1_codes(blocks * c).view(x.shape[0], -1)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, s_b, s_dec


E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def nvfp4_unpack(packed, s_b, s_dec, lut):
    lo = (packed & 0xF).long()
    hi = (packed >> 4).long()
    values = torch.stack([lut[lo], lut[hi]], dim=-1).view(packed.shape[0], -1)
    return (values.view(-1, 16) * s_b.float() * s_dec).to(torch.bfloat16).view(packed.shape[0], -1)


def median_us(fn, inputs, warmup, iters):
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    times = []
    for i in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(inputs[i % len(inputs)])
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes-mib", default="4,16,64,256")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    lut = torch.tensor(E2M1_VALUES, device="cuda")
    compiled = {name: torch.compile(fn) for name, fn in [
        ("fp8_pack", fp8_pack), ("fp8_unpack", fp8_unpack), ("mxfp8_pack", mxfp8_pack),
        ("mxfp8_unpack", mxfp8_unpack), ("nvfp4_pack", nvfp4_pack), ("nvfp4_unpack", nvfp4_unpack)]}
    rows = []
    print(f"peer: torch {torch.__version__} torch.compile on {torch.cuda.get_device_name()}")
    for mib in [int(s) for s in args.sizes_mib.split(",")]:
        n_rows = mib * MIB // 2 // COLS
        sets = max(2, ROTATION_BYTES // (mib * MIB))
        xs = [torch.randn(n_rows, COLS, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        shard_bytes = mib * MIB
        copy_dst = [torch.empty_like(x) for x in xs]
        copy_us = median_us(lambda x: copy_dst[0].copy_(x), xs,
                            args.warmup, args.iters)
        copy_gbps = 2 * shard_bytes / copy_us / 1e3
        rows.append(dict(format="-", op="d2d_copy", shard_mib=mib, bytes=2 * shard_bytes,
                         median_us=copy_us, gbps=copy_gbps))
        packed = {
            "fp8": [compiled["fp8_pack"](x) for x in xs],
            "mxfp8": [compiled["mxfp8_pack"](x) for x in xs],
            "nvfp4_1d": [compiled["nvfp4_pack"](x) for x in xs],
        }
        wire = {"fp8": shard_bytes // 2, "mxfp8": shard_bytes // 2 + shard_bytes // 64,
                "nvfp4_1d": shard_bytes // 4 + shard_bytes // 32}
        cases = [
            ("fp8", "pack", lambda x: compiled["fp8_pack"](x), xs),
            ("fp8", "unpack_bf16", lambda p: compiled["fp8_unpack"](*p), packed["fp8"]),
            ("mxfp8", "pack", lambda x: compiled["mxfp8_pack"](x), xs),
            ("mxfp8", "unpack_bf16", lambda p: compiled["mxfp8_unpack"](*p), packed["mxfp8"]),
            ("nvfp4_1d", "pack", lambda x: compiled["nvfp4_pack"](x), xs),
            ("nvfp4_1d", "unpack_bf16", lambda p: compiled["nvfp4_unpack"](*p, lut), packed["nvfp4_1d"]),
        ]
        for fmt, op, fn, inputs in cases:
            us = median_us(fn, inputs, args.warmup, args.iters)
            io = shard_bytes + wire[fmt]
            rows.append(dict(format=fmt, op=op, shard_mib=mib, bytes=io, median_us=us,
                             gbps=io / us / 1e3, copy_gbps=copy_gbps,
                             percent_of_copy=100 * io / us / 1e3 / copy_gbps))
            print(f"{fmt:9s} {op:12s} {mib:5d} MiB {us:10.1f} us {io / us / 1e3:8.1f} GB/s "
                  f"({100 * io / us / 1e3 / copy_gbps:5.1f}% of copy)")
        del xs, packed, copy_dst
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(tool="torch_quant_peer", torch=torch.__version__,
                           gpu=torch.cuda.get_device_name(), results=rows), f, indent=2)


if __name__ == "__main__":
    main()
