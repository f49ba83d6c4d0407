"""Context.materialize_views over the host backend, 2 and 4 processes: the GEMM-ready layout of every
wire format decoded in numpy (docs/formats.md) equals the BF16 layout of the same weight bit for bit,
transposes are the transposed codes, and misuse raises."""
import numpy as np
import pytest

import gtp
from ranks import run_ranks, store_path

ROWS, COLS = 40, 64  # rows not a multiple of 16 x G: tail padding, and at G = 4 shards holding none


def full_weight(seed):
    # 2^+-6 magnitude bands per row so blocks get different scales (and some E4M3 / E2M1 subnormal codes).
    rng = np.random.default_rng(seed)
    bands = np.exp2(rng.integers(-6, 7, size=(ROWS, 1))).astype(np.float32)
    return (rng.standard_normal((ROWS, COLS)).astype(np.float32) * bands).astype(np.float32)


def e4m3_values():
    """float32 value of every E4M3 ("FN") code: bias 7, 3 mantissa bits, S.1111.111 NaN."""
    codes = np.arange(256)
    exponent, mantissa = (codes >> 3) & 0xF, codes & 7
    magnitude = np.where(exponent == 0, mantissa * 2.0 ** -9, (1 + mantissa / 8.0) * np.exp2(exponent - 7.0))
    values = np.where(codes >> 7, -magnitude, magnitude).astype(np.float32)
    values[(codes & 0x7F) == 0x7F] = np.nan
    return values


E4M3 = e4m3_values()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def e8m0_values(codes):
    values = np.ldexp(np.float32(1), codes.astype(np.int32) - 127).astype(np.float32)
    return np.where(codes == 0xFF, np.float32(np.nan), values)


def unpack_e2m1(bytes_):
    """[r, c/2] bytes -> [r, c] codes, element 2k in the low nibble of byte k."""
    out = np.empty((bytes_.shape[0], bytes_.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2], out[:, 1::2] = bytes_ & 0xF, bytes_ >> 4
    return out


def decode_gemm(m):
    """float32 [gemm_rows, cols] of a GEMM-layout materialization, in the FP32 operation order of
    docs/formats.md (every product rounded on its own; numpy float32 does not fuse)."""
    if m.wire == "fp8":
        values = E4M3[m.data.array]
    elif m.wire == "mxfp8":
        values = E4M3[m.data.array] * np.repeat(e8m0_values(m.scales.array), m.scale_block[1], axis=1)
    else:
        block_scales = np.repeat(E4M3[m.scales.array], m.scale_block[0], axis=0)  # 16 rows per 2D tile
        values = E2M1[unpack_e2m1(m.data.array)] * np.repeat(block_scales, m.scale_block[1], axis=1)
    if m.decode_scales is not None:
        per_row = np.repeat(m.decode_scales.array[:, 0], m.decode_scale_rows)[:m.gemm_rows]
        values = values * per_row[:, None]
    return values.astype(np.float32)


def _views(rank, world, store_dir, wire):
    store = gtp.FileStore(store_path(store_dir))
    with gtp.Context(store, rank, world) as ctx:
        g = ctx.geometry(ROWS, COLS, wire)
        weights = []
        for e in range(3):  # a leader and two experts: one materialize call expands to three views
            shard = full_weight(10 + e)[g.row_start:g.row_start + g.valid_rows].copy()
            weights.append(ctx.register(f"expert{e}", shard, ROWS, COLS, wire=wire,
                                        expert_leader=weights[0] if weights else None))
        leader = weights[0]
        ctx.shard_updated([leader])
        gemm = ctx.materialize_views([leader], layout="gemm")
        bf16 = ctx.materialize_views([leader], layout="bf16")  # both held at once: two materializations
        out = {"members": [m.weight.name for m in gemm], "geometry": g}
        out["gemm"] = [{"layout": m.layout, "wire": m.wire, "rows": m.rows, "cols": m.cols, "gemm_rows": m.gemm_rows,
                        "decode_scale_rows": m.decode_scale_rows, "scale_block": m.scale_block,
                        "nvfp4_2d": m.nvfp4_2d, "decoded": decode_gemm(m) if m.layout == "gemm" else None,
                        "sections": {k: (s.dtype, s.rows, s.cols, s.ld, s.array.copy()) for k, s in m.sections().items()}}
                       for m in gemm]
        out["bf16"] = [(m.layout, m.data.dtype, m.data.array.copy()) for m in bf16]
        out["materialize_arrays"] = None
        errors = {}
        try:
            ctx.release([leader])  # held in both layouts: ambiguous
        except gtp.InvalidStateError as e:
            errors["ambiguous"] = str(e)
        ctx.release([leader], layout="gemm")
        try:
            ctx.release([leader], layout="gemm")
        except gtp.InvalidStateError as e:
            errors["double"] = str(e)
        for call in (lambda: ctx.release([leader], layout="fp8"),
                     lambda: ctx.materialize_views([leader], layout="nvfp4")):
            try:
                call()
            except ValueError as e:
                errors.setdefault("layout", []).append(str(e))
        ctx.release([leader])  # only the BF16 layout is held now
        [plain] = ctx.materialize_arrays([weights[1]])  # a member alone is not the group: still the same bits
        out["materialize_arrays"] = plain.copy()
        ctx.release([weights[1]])
        ctx.drain()
        out["errors"] = errors
        return out


@pytest.mark.parametrize("wire,world", [("fp8", 2), ("mxfp8", 2), ("nvfp4", 2), ("fp8", 4), ("mxfp8", 4),
                                        ("nvfp4", 4), ("bf16", 2)])
def test_gemm_layout_decodes_to_the_bf16_layout_bit_for_bit(wire, world):
    results = run_ranks(_views, world, wire)
    first = results[0]
    align = 32 if wire == "mxfp8" else 16
    gemm_rows = -(-ROWS // align) * align
    for r in results:
        assert r["members"] == ["expert0", "expert1", "expert2"]
        for view, (bf16_layout, bf16_dtype, bf16) in zip(r["gemm"], r["bf16"]):
            assert (bf16_layout, bf16_dtype, bf16.shape) == ("bf16", "bf16", (ROWS, COLS))
            assert view["rows"] == ROWS and view["cols"] == COLS and view["wire"] == wire
            sections = view["sections"]
            for name, (_, rows, cols, ld, array) in sections.items():
                assert ld == cols and array.shape[0] == rows, name
            if wire == "bf16":  # the GEMM layout of the BF16 wire is the BF16 weight
                assert view["layout"] == "bf16" and list(sections) == ["data"]
                np.testing.assert_array_equal(sections["data"][4], bf16)
                continue
            assert view["layout"] == "gemm" and view["gemm_rows"] == gemm_rows and not view["nvfp4_2d"]
            data = sections["data"]
            assert data[:3] == ("e2m1" if wire == "nvfp4" else "e4m3", gemm_rows, COLS)
            assert not data[4][ROWS:].any(), "rows past `rows` are zero codes"
            decoded = view["decoded"]
            assert decoded.shape == (gemm_rows, COLS)
            # The BF16 layout is the same decode rounded once to BF16 (docs/formats.md, Unpack (a)).
            np.testing.assert_array_equal(gtp.float32_to_bf16_bits(decoded[:ROWS]), bf16)
            # MXFP8 decodes E4M3 x 2^k, exact in BF16; FP8 and NVFP4 multiply by an FP32 decode scale, finer.
            exact = np.array_equal(decoded[:ROWS], gtp.bf16_bits_to_float32(bf16))
            assert exact == (wire == "mxfp8")
            if wire == "fp8":
                assert set(sections) == {"data", "data_t", "decode_scales"} and view["scale_block"] == (0, 0)
                assert sections["data_t"][:3] == ("e4m3", COLS, gemm_rows)
                np.testing.assert_array_equal(sections["data_t"][4], data[4].T)
            elif wire == "mxfp8":
                assert set(sections) == {"data", "scales"} and view["scale_block"] == (1, 32)
                assert sections["scales"][:3] == ("e8m0", gemm_rows, COLS // 32)
            else:
                assert set(sections) == {"data", "scales", "decode_scales"} and view["scale_block"] == (1, 16)
                assert sections["scales"][:3] == ("e4m3", gemm_rows, COLS // 16)
                assert data[4].shape == (gemm_rows, COLS // 2)  # two codes per byte
            if "decode_scales" in sections:
                scales = sections["decode_scales"]
                assert scales[:3] == ("fp32", world, 1) and view["decode_scale_rows"] == r["geometry"].shard_rows
                assert np.all(scales[4] == scales[4][0]), "one group-wide amax: every chunk decodes alike"
        np.testing.assert_array_equal(r["materialize_arrays"], r["bf16"][1][2])
        for a, b in zip(r["gemm"], first["gemm"]):  # every rank holds the same bytes
            for name, section in a["sections"].items():
                np.testing.assert_array_equal(section[4], b["sections"][name][4])
        errors = r["errors"]
        assert "both the BF16 and the GEMM layout" in errors["ambiguous"]
        assert "not materialized in the gemm layout" in errors["double"]
        assert len(errors["layout"]) == 2 and all("layout=" in e and "'gemm'" in e for e in errors["layout"])


def mx_weight():
    """Blocks whose amax 1.875 splits the MXFP8 rules: RCEIL keeps it (scale 2^-7), FLOOR takes 2^-8 and
    saturates 1.875 * 2^8 = 480 to 448 (docs/formats.md)."""
    w = (((np.arange(64)[:, None] * 5 + np.arange(COLS)[None, :] * 3) % 15) - 7).astype(np.float32) * 0.125
    w[:, 0::32] = 1.875
    return w


def _block_shape_and_rounding(rank, world, store_dir):
    store = gtp.FileStore(store_path(store_dir))
    out = {}
    with gtp.Context(store, rank, world) as ctx:
        g = ctx.geometry(ROWS, COLS, "nvfp4")
        nv = ctx.register("nv2d", full_weight(3)[g.row_start:g.row_start + g.valid_rows].copy(), ROWS, COLS,
                          wire="nvfp4", nvfp4_2d=True)
        gm = ctx.geometry(64, COLS, "mxfp8")
        mx = {rounding: ctx.register(f"mx_{rounding}", mx_weight()[gm.row_start:gm.row_start + gm.valid_rows].copy(),
                                     64, COLS, wire="mxfp8", mx_rounding=rounding)
              for rounding in ("rceil", "floor")}
        out["attributes"] = (nv.nvfp4_2d, nv.mx_rounding, mx["floor"].mx_rounding, mx["rceil"].nvfp4_2d)
        weights = [nv, mx["rceil"], mx["floor"]]
        ctx.shard_updated(weights)
        for w in weights:
            [view] = ctx.materialize_views([w], layout="gemm")
            [bf16] = ctx.materialize_views([w], layout="bf16")
            sections = {k: (s.dtype, s.rows, s.cols, s.array.copy()) for k, s in view.sections().items()}
            out[w.name] = {"nvfp4_2d": view.nvfp4_2d, "scale_block": view.scale_block, "decoded": decode_gemm(view),
                           "sections": sections, "bf16": bf16.data.array.copy()}
            ctx.release([w], layout="gemm")
            ctx.release([w], layout="bf16")
        ctx.drain()
        errors = {}
        shard = np.zeros((g.valid_rows, COLS), dtype=np.float32)
        for key, call in (("2d_on_fp8", lambda: ctx.register("bad", shard, ROWS, COLS, wire="fp8", nvfp4_2d=True)),
                          ("rounding", lambda: ctx.register("bad", shard, ROWS, COLS, wire="mxfp8", mx_rounding="up")),
                          ("expert", lambda: ctx.register("bad", shard, ROWS, COLS, wire="nvfp4", expert_leader=nv))):
            try:
                call()
            except ValueError as e:
                errors[key] = (type(e).__name__, str(e))
        out["errors"] = errors
    return out


def test_register_takes_the_nvfp4_block_shape_and_the_mxfp8_rounding():
    results = run_ranks(_block_shape_and_rounding, 2)
    gemm_rows = -(-ROWS // 16) * 16
    for r in results:
        assert r["attributes"] == (True, "rceil", "floor", False)
        nv = r["nv2d"]
        assert nv["nvfp4_2d"] and nv["scale_block"] == (16, 16)
        sections = nv["sections"]
        assert set(sections) == {"data", "scales", "data_t", "scales_t", "decode_scales"}
        assert sections["scales"][:3] == ("e4m3", gemm_rows // 16, COLS // 16)
        assert sections["data_t"][:3] == ("e2m1", COLS, gemm_rows)
        assert sections["scales_t"][:3] == ("e4m3", COLS // 16, gemm_rows // 16)
        # The exact transpose: transposed codes and transposed tile scales.
        np.testing.assert_array_equal(unpack_e2m1(sections["data_t"][3]), unpack_e2m1(sections["data"][3]).T)
        np.testing.assert_array_equal(sections["scales_t"][3], sections["scales"][3].T)
        np.testing.assert_array_equal(gtp.float32_to_bf16_bits(nv["decoded"][:ROWS]), nv["bf16"])
        for name in ("mx_rceil", "mx_floor"):
            np.testing.assert_array_equal(gtp.float32_to_bf16_bits(r[name]["decoded"][:64]), r[name]["bf16"])
        rceil, floor = r["mx_rceil"]["decoded"], r["mx_floor"]["decoded"]
        assert rceil[0, 0] == np.float32(1.875) and floor[0, 0] == np.float32(1.75)
        assert not np.array_equal(r["mx_rceil"]["sections"]["scales"][3], r["mx_floor"]["sections"]["scales"][3])
        errors = r["errors"]
        assert errors["2d_on_fp8"][0] == "InvalidArgumentError"
        assert "nvfp4_2d is 1 but the wire is fp8" in errors["2d_on_fp8"][1]
        assert "mx_rounding='up' is unknown" in errors["rounding"][1]
        assert errors["expert"][0] == "InvalidArgumentError"
        assert "nvfp4 (1d), the leader's nvfp4 (2d)" in errors["expert"][1]


def unblock(section_bytes, rows, cols):
    """Blocked 128x4 scale bytes -> the [rows, cols] matrix, undoing the tile order PyTorch code builds
    for cuBLASLt (view(nrb, 128, ncb, 4).permute(0, 2, 1, 3), then 4 x 32 -> 32 x 4 inside each tile);
    also returns the whole padded matrix."""
    nrb, ncb = -(-rows // 128), -(-cols // 4)
    tiles = np.asarray(section_bytes).reshape(nrb, ncb, 32, 4, 4)  # tile row, tile col, r % 32, r // 32, c % 4
    padded = tiles.transpose(0, 3, 2, 1, 4).reshape(nrb * 128, ncb * 4)
    return padded[:rows, :cols], padded


def _blocked_scales(rank, world, store_dir):
    store = gtp.FileStore(store_path(store_dir))
    out = {}
    with gtp.Context(store, rank, world) as ctx:
        for wire, two_d in (("mxfp8", False), ("nvfp4", False), ("nvfp4", True)):
            g = ctx.geometry(ROWS, COLS, wire)
            shard = full_weight(7)[g.row_start:g.row_start + g.valid_rows].copy()
            pair = [ctx.register(f"{wire}{two_d}_{layout}", shard, ROWS, COLS, wire=wire, nvfp4_2d=two_d,
                                 gemm_scales=layout) for layout in ("row_major", "blocked_128x4")]
            ctx.shard_updated(pair)
            views = [ctx.materialize_views([w], layout="gemm")[0] for w in pair]
            out[(wire, two_d)] = [{"scale_layout": v.scale_layout, "scale_block": v.scale_block,
                                   "sections": {k: (s.dtype, s.rows, s.cols, s.array.copy())
                                                for k, s in v.sections().items()}} for v in views]
            for w in pair:
                ctx.release([w], layout="gemm")
        ctx.drain()
        try:
            ctx.register("bad", shard, ROWS, COLS, wire="mxfp8", gemm_scales="swizzled")
        except ValueError as e:
            out["error"] = str(e)
    return out


def test_blocked_scales_hold_the_row_major_scales_in_cublas_tile_order():
    results = run_ranks(_blocked_scales, 2)
    for r in results:
        assert "gemm_scales='swizzled' is unknown" in r["error"]
        for (wire, two_d), (row_major, blocked) in ((k, v) for k, v in r.items() if k != "error"):
            assert (row_major["scale_layout"], blocked["scale_layout"]) == ("row_major", "blocked_128x4")
            assert blocked["scale_block"] == ((1, 16) if wire == "nvfp4" else (1, 32))
            rm, bl = row_major["sections"], blocked["sections"]
            np.testing.assert_array_equal(rm["data"][3], bl["data"][3])
            for name in ("scales", "scales_t") if two_d else ("scales",):
                matrix = rm[name][3]
                if two_d:  # blocked: a scale row per code row, each 16x16 tile's scale on its 16 rows
                    matrix = np.repeat(matrix, 16, axis=0)
                dtype, rows, cols, section = bl[name]
                assert dtype == rm[name][0] and rows % 128 == 0 and cols % 4 == 0, name
                got, padded = unblock(section, *matrix.shape)
                np.testing.assert_array_equal(got, matrix, err_msg=f"{wire} 2d={two_d} {name}")
                assert padded.sum() == matrix.astype(np.int64).sum(), "the tile padding is zero"
            if two_d:
                np.testing.assert_array_equal(rm["data_t"][3], bl["data_t"][3])
