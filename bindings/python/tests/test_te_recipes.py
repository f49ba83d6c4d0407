"""Which TE recipe gets which libgtp wire as what (gtp.torch.te_quantized.recipe_layout), on the host
backend without TE (tests/test_te.py builds the TE tensors on a GPU). `_Recipe` is a test double for TE
2.20's recipe objects, named so: the class predicates and weight parameters recipe_layout reads
(transformer_engine/common/recipe), with TE's defaults."""
import os
import sys
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gtp.torch as gt  # noqa: E402
from gtp.torch import te_quantized as tq  # noqa: E402
from ranks import run_ranks, store_path  # noqa: E402


class _Recipe:
    """A TE recipe double: kind is "fp8cs", "nvfp4", "mxfp8" or "delayed"; keyword overrides as TE's fields."""

    def __init__(self, kind, **fields):
        self.kind = kind
        self.fp8_quant_fwd_weight = SimpleNamespace(power_2_scale=False, amax_epsilon=0.0)
        self.fp4_quant_fwd_weight = SimpleNamespace(fp4_2d_quantization=True, random_hadamard_transform=False,
                                                    stochastic_rounding=False)
        self.nvfp4_4over6, self.enable_2d_quantization = "none", False
        for name, value in fields.items():
            target = self.fp4_quant_fwd_weight if hasattr(self.fp4_quant_fwd_weight, name) else self
            setattr(target, name, value)

    def float8_current_scaling(self):
        return self.kind == "fp8cs"

    def nvfp4(self):
        return self.kind == "nvfp4"

    def mxfp8(self):
        return self.kind == "mxfp8"


def _layout(monkeypatch, param, recipe, phase="forward"):
    monkeypatch.setattr(tq, "_active_recipe", lambda: recipe)
    tq.phase_recipe(param, "forward")  # the forward records the recipe its backward runs under
    return tq.recipe_layout(param, phase)


@pytest.fixture
def ctx(tmp_path):
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1) as context:
        yield context


def _param(ctx, rows=64, cols=64, **register):
    return gt.ShardedParameter(torch.randn(rows, cols), ctx, f"w{len(ctx.parameters)}", rows, cols, **register)


def test_each_quantized_wire_goes_to_its_recipe(ctx, monkeypatch):
    nvfp4 = _param(ctx, wire="nvfp4", nvfp4_2d=True)
    assert _layout(monkeypatch, nvfp4, _Recipe("nvfp4")) == tq.NVFP4_2D
    assert _layout(monkeypatch, nvfp4, _Recipe("nvfp4"), "backward") == tq.NVFP4_2D  # dgrad: both usages
    mxfp8 = _param(ctx, wire="mxfp8")
    assert _layout(monkeypatch, mxfp8, _Recipe("mxfp8")) == tq.MXFP8_ROWWISE
    assert _layout(monkeypatch, _param(ctx, wire="fp8"), _Recipe("fp8cs")) == tq.FP8_CURRENT
    assert {tq.NVFP4_2D, tq.MXFP8_ROWWISE, tq.FP8_CURRENT} == set(tq.GEMM_LAYOUTS)
    for wire, extra in (("nvfp4", {"nvfp4_2d": True}), ("mxfp8", {}), ("fp8", {})):
        assert _layout(monkeypatch, _param(ctx, wire=wire, **extra), None) is None, "no TE recipe: BF16"


def test_nvfp4_refusals_name_the_fix(ctx, monkeypatch):
    with pytest.raises(ValueError, match=r"nvfp4_2d=True \(profile nvfp4_blocks: \"2d\"\)"):
        _layout(monkeypatch, _param(ctx, wire="nvfp4"), _Recipe("nvfp4"))
    two_d = _param(ctx, wire="nvfp4", nvfp4_2d=True)
    for fields in ({"fp4_2d_quantization": False}, {"random_hadamard_transform": True},
                   {"stochastic_rounding": True}, {"nvfp4_4over6": "weights"}, {"nvfp4_4over6": "all"}):
        with pytest.raises(ValueError, match="use the recipe's defaults"):
            _layout(monkeypatch, two_d, _Recipe("nvfp4", **fields))
    assert _layout(monkeypatch, two_d, _Recipe("nvfp4", nvfp4_4over6="activations")) == tq.NVFP4_2D
    with pytest.raises(ValueError, match="multiples of 16; use the BF16 wire"):
        _layout(monkeypatch, _param(ctx, 40, 64, wire="nvfp4", nvfp4_2d=True), _Recipe("nvfp4"))
    for recipe in (_Recipe("mxfp8"), _Recipe("fp8cs"), _Recipe("delayed")):
        with pytest.raises(ValueError, match="register the weight with wire='bf16'"):
            _layout(monkeypatch, two_d, recipe)


def test_mxfp8_refusals_name_the_fix(ctx, monkeypatch):
    mxfp8 = _param(ctx, wire="mxfp8")
    assert _layout(monkeypatch, mxfp8, _Recipe("mxfp8")) == tq.MXFP8_ROWWISE
    with pytest.raises(ValueError, match="32x1 blocks.*train with wire='bf16' under MXFP8BlockScaling"):
        tq.recipe_layout(mxfp8, "backward")
    with pytest.raises(ValueError, match="enable_2d_quantization=True"):
        _layout(monkeypatch, mxfp8, _Recipe("mxfp8", enable_2d_quantization=True))
    with pytest.raises(ValueError, match="mx_rounding='rceil'"):
        _layout(monkeypatch, _param(ctx, wire="mxfp8", mx_rounding="floor"), _Recipe("mxfp8"))
    with pytest.raises(ValueError, match="multiples of 32"):
        _layout(monkeypatch, _param(ctx, 48, 64, wire="mxfp8"), _Recipe("mxfp8"))
    with pytest.raises(ValueError, match="register the weight with wire='bf16'"):
        _layout(monkeypatch, mxfp8, _Recipe("nvfp4"))


def test_te_scale_shapes():
    """TE 2.20's NVFP4Quantizer / MXFP8Quantizer.get_scale_shape: [round_up(outer, 128), round_up(blocks, 4)]."""
    assert tq.nvfp4_scale_shape(144, 80, columnwise=False) == (256, 8)
    assert tq.nvfp4_scale_shape(144, 80, columnwise=True) == (128, 12)
    assert tq.nvfp4_scale_shape(512, 256, columnwise=False) == (512, 16)
    assert tq.mxfp8_scale_shape(96, 160) == (128, 8)
    assert tq.mxfp8_scale_shape(512, 256) == (512, 8)


def test_weight_amax_is_libgtp_finite_amax_of_the_latest_pack(ctx):
    param = _param(ctx, wire="nvfp4", nvfp4_2d=True)
    with torch.no_grad():
        param.fill_(0.5)
        param[1, 2], param[3, 4], param[5, 6] = -3.0, float("nan"), float("inf")
    ctx.shard_updated([param])
    assert torch.equal(tq.weight_amax(param), torch.tensor([3.0])), "the largest finite |x|"
    param.data[0, 0] = -7.0  # through .data (no version bump), and without shard_updated: the wire is as it was
    assert torch.equal(tq.weight_amax(param), torch.tensor([3.0])), "the amax the wire was packed with"
    ctx.shard_updated([param])
    assert torch.equal(tq.weight_amax(param), torch.tensor([7.0])), "re-packed: the new amax"
    other = _param(ctx, wire="nvfp4")  # 1D: TE never gets it as an NVFP4Tensor, nothing kept
    ctx.shard_updated([other])
    assert getattr(other, "_te_amax", None) is None


def _full_nvfp4_weight(step, rows, cols):
    """The whole weight of `step` (every rank builds it): its largest |x| in rank 0's rows at step 0, in
    rank 1's (the last rows) at step 1, with an Inf and a NaN (skipped by the amax) on the other rank."""
    torch.manual_seed(11 + step)
    full = torch.randn(rows, cols)
    peak_row, other_row = (5, rows - 3) if step == 0 else (rows - 3, 5)
    full[peak_row, 7] = -9.0 if step == 0 else 13.0
    full[other_row, 1], full[other_row, 2] = float("inf"), float("nan")
    return full


def _two_rank_nvfp4(rank, world, store_dir, rows, cols):
    """At G = 2: the NVFP4 wire goes to NVFP4BlockScaling; per step, this rank's local amax, the amax TE's
    tensor gets (through _refresh, what every materialize runs), and its worst relative error decoding
    the GEMM layout as TE does (global decode scale amax / 2688) against libgtp's BF16 layout."""
    ctx = gt.Context(torch.distributed.FileStore(store_path(store_dir), world), rank, world)
    try:
        geometry = ctx.geometry(rows, cols, "nvfp4")
        mine = slice(geometry.row_start, geometry.row_start + geometry.valid_rows)
        param = gt.ShardedParameter(_full_nvfp4_weight(0, rows, cols)[mine], ctx, "w", rows, cols, wire="nvfp4", nvfp4_2d=True)
        tq._active_recipe = lambda: _Recipe("nvfp4")
        layout = tq.recipe_layout(param, "forward")
        out = []
        for step in range(2):
            if step:
                with torch.no_grad():
                    param.copy_(_full_nvfp4_weight(step, rows, cols)[mine])
            ctx.shard_updated([param])
            full = ctx.view_at(ctx.materialize([param.gtp_weight])[0], (rows, cols), torch.bfloat16).float()
            ctx.release([param.gtp_weight])
            (view,) = param.materialize_group_views(layout="gemm")
            tensor = SimpleNamespace(
                _amax_rowwise=None, _amax_columnwise=None,
                _rowwise_scale_inv=torch.zeros(tq.nvfp4_scale_shape(rows, cols, False), dtype=torch.uint8),
                _columnwise_scale_inv=torch.zeros(tq.nvfp4_scale_shape(rows, cols, True), dtype=torch.uint8))
            tq._refresh(tensor, view, param)
            assert tuple(view.data_t.tensor.shape) == (cols, rows // 2), "TE's column-wise data shape"
            amax = tensor._amax_rowwise
            decoded = _decode_te_nvfp4(view.data.tensor[:rows], tensor._rowwise_scale_inv, amax / 2688.0)
            finite = full.isfinite()  # a 16x16 tile holding an Inf or a NaN decodes to NaN, in TE's semantics too
            assert torch.equal(decoded.isfinite(), finite) and not finite.all()
            error = ((decoded - full).abs() / full.abs().clamp_min(1e-30))[finite].max().item()
            param.release_group("gemm")
            local = param.detach().abs().nan_to_num(0.0, 0.0, 0.0).amax().item()
            out.append((local, amax.item(), amax.dtype, tuple(amax.shape), tensor._amax_columnwise is amax, error))
        return layout, out
    finally:
        ctx.close()


@pytest.mark.parametrize("shape", [(64, 64), (144, 80)], ids=["64x64", "144x80_padded"])
def test_nvfp4_at_g_2_gets_the_group_reduced_amax(shape):
    """G = 2, each rank's shard with a different amax: TE's NVFP4Tensor on either rank gets the max over both
    (libgtp's amax slot, gtp_weight_amax), after the second update the new max, and decoding the gathered
    GEMM layout with TE's amax / 2688 gives libgtp's BF16 layout (up to its rounding)."""
    results = run_ranks(_two_rank_nvfp4, 2, *shape)
    for step, want in enumerate((9.0, 13.0)):
        locals_ = [out[step][0] for _, out in results]
        assert want in locals_ and min(locals_) < want, "one rank holds the peak, the other a smaller amax"
        for layout, out in results:
            _, amax, dtype, shape, shared, error = out[step]
            assert layout == tq.NVFP4_2D
            assert amax == want and dtype == torch.float32 and shape == (1,) and shared, out[step]
            assert error <= 2 ** -8, f"step {step}: TE's decode is off libgtp's BF16 layout by {error}"


_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _decode_te_nvfp4(data, scales, decode_scale):
    """TE's NVFP4 row-wise semantics: element (r, c) = E2M1 code (low nibble first) x E4M3 scale [r, c / 16],
    times the global decode scale."""
    codes = torch.stack([data & 0xF, data >> 4], dim=-1).reshape(data.shape[0], -1).long()
    block = scales[:codes.shape[0], :codes.shape[1] // 16].view(torch.float8_e4m3fn).float()
    return (_E2M1[codes] * block.repeat_interleave(16, dim=1)) * decode_scale


def test_nvfp4_scales_in_te_layout_decode_to_the_wire(ctx):
    """te_quantized's copy of the 2D wire's tile scales into TE's layout (each tile's scale on its 16 rows,
    zero-padded to TE's 128 x 4 multiples), both usages: decoded with TE's row-wise semantics, the codes
    give libgtp's BF16 layout and its transpose, and the padding is zero. (The same on a GPU against TE:
    tests/test_te.py.)"""
    rows, cols = 144, 80
    torch.manual_seed(7)
    shard = torch.randn(rows, cols).to(torch.bfloat16)
    shard[rows - 16:, :16] *= 1e-4
    param = gt.ShardedParameter(shard, ctx, "w", rows, cols, wire="nvfp4", nvfp4_2d=True)
    ctx.shard_updated([param])
    full = ctx.view_at(ctx.materialize([param.gtp_weight])[0], (rows, cols), torch.bfloat16).clone()
    ctx.release([param.gtp_weight])
    (view,) = param.materialize_group_views(layout="gemm")
    tensor = SimpleNamespace(_amax_rowwise=None, _amax_columnwise=None,
                             _rowwise_scale_inv=torch.full(tq.nvfp4_scale_shape(rows, cols, False), 0xAB,
                                                           dtype=torch.uint8),
                             _columnwise_scale_inv=torch.full(tq.nvfp4_scale_shape(rows, cols, True), 0xAB,
                                                              dtype=torch.uint8))
    tensor._rowwise_scale_inv[:rows, :cols // 16] = 0  # what nvfp4_tensor allocates: zeros (here: garbage outside)
    tensor._rowwise_scale_inv[rows:] = tensor._rowwise_scale_inv[:, cols // 16:] = 0
    tensor._columnwise_scale_inv.zero_()
    tq._refresh(tensor, view, param)
    decode_scale = view.decode_scales.tensor.reshape(-1)[0]
    rowwise = _decode_te_nvfp4(view.data.tensor[:rows], tensor._rowwise_scale_inv, decode_scale)
    columnwise = _decode_te_nvfp4(view.data_t.tensor, tensor._columnwise_scale_inv, decode_scale)
    assert torch.equal(rowwise.to(torch.bfloat16), full), "row-wise usage decodes to the BF16 layout"
    assert torch.equal(columnwise.to(torch.bfloat16), full.t()), "column-wise usage decodes to its transpose"
    assert not tensor._rowwise_scale_inv[rows:].any() and not tensor._rowwise_scale_inv[:, cols // 16:].any()
    assert not tensor._columnwise_scale_inv[cols:].any() and not tensor._columnwise_scale_inv[:, rows // 16:].any()
    assert torch.equal(tensor._amax_rowwise, shard.abs().amax().float().reshape(1))
    assert tensor._amax_columnwise is tensor._amax_rowwise
    param.release_group("gemm")


def test_mxfp8_scales_in_te_layout_decode_to_the_wire(ctx):
    """te_quantized's copy of the MXFP8 wire's E8M0 scales into TE's padded row-wise layout: decoded with
    TE's semantics (E4M3 code x 2^(e - 127) per 1x32 block) the codes give libgtp's BF16 layout."""
    rows, cols = 96, 160
    torch.manual_seed(8)
    param = gt.ShardedParameter(torch.randn(rows, cols).to(torch.bfloat16), ctx, "w", rows, cols, wire="mxfp8")
    ctx.shard_updated([param])
    full = ctx.view_at(ctx.materialize([param.gtp_weight])[0], (rows, cols), torch.bfloat16).clone()
    ctx.release([param.gtp_weight])
    (view,) = param.materialize_group_views(layout="gemm")
    tensor = SimpleNamespace(_rowwise_scale_inv=torch.zeros(tq.mxfp8_scale_shape(rows, cols), dtype=torch.uint8))
    tq._refresh(tensor, view, param)
    scales = tensor._rowwise_scale_inv
    codes = view.data.tensor[:rows].view(torch.float8_e4m3fn).float()
    block = torch.exp2(scales[:rows, :cols // 32].float() - 127).repeat_interleave(32, dim=1)
    assert torch.equal((codes * block).to(torch.bfloat16), full)
    assert not scales[rows:].any() and not scales[:, cols // 32:].any()
    param.release_group("gemm")


def test_a_profile_wire_goes_to_its_recipe(tmp_path, monkeypatch):
    """wire="from_group": the group's profile wire and nvfp4_blocks decide, as libgtp resolved them."""
    import json
    profile = json.dumps({
        "schema_version": 1,
        "cluster": {"template": {"host_count": 1, "host": {
            "numa_nodes": [{"os_index": 0, "cpuset": "0xff"}], "gpus": [{"index": 0, "numa_node": 0}]}}},
        "parallel": {"world_size": 1, "tensor_parallel_num_weight_shards": 1},
        "groups": {"gtp_remat": {"wire_format": "nvfp4", "nvfp4_blocks": "2d"}}})
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1, profile_json=profile) as ctx:
        param = _param(ctx, wire="from_group")
        assert _layout(monkeypatch, param, _Recipe("nvfp4")) == tq.NVFP4_2D
        ctx.shard_updated([param])
        assert torch.equal(tq.weight_amax(param), param.detach().abs().amax().reshape(1))
