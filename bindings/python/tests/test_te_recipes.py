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


def test_shard_amax_is_libgtp_finite_amax_and_follows_updates(ctx):
    param = _param(ctx, wire="nvfp4", nvfp4_2d=True)
    with torch.no_grad():
        param.fill_(0.5)
        param[1, 2], param[3, 4], param[5, 6] = -3.0, float("nan"), float("inf")
    assert torch.equal(tq.shard_amax(param), torch.tensor([3.0])), "the largest finite |x|"
    first = tq.shard_amax(param)
    assert tq.shard_amax(param) is first, "unchanged shard: not computed again"
    with torch.no_grad():
        param[0, 0] = -7.0  # the optimizer's in-place step
    assert torch.equal(tq.shard_amax(param), torch.tensor([7.0]))


def _two_rank_nvfp4(rank, world, store_dir):
    ctx = gt.Context(torch.distributed.FileStore(store_path(store_dir), world), rank, world)
    try:
        geometry = ctx.geometry(64, 64, "nvfp4")
        param = gt.ShardedParameter(torch.randn(geometry.valid_rows, 64), ctx, "w", 64, 64, wire="nvfp4",
                                    nvfp4_2d=True)
        tq._active_recipe = lambda: _Recipe("nvfp4")
        try:
            tq.recipe_layout(param, "forward")
        except ValueError as error:
            return str(error)
        return None
    finally:
        ctx.close()


def test_nvfp4_at_g_above_1_is_refused_with_the_fix():
    for message in run_ranks(_two_rank_nvfp4, 2):
        assert message is not None and "at G = 2" in message and "Use the BF16 wire under NVFP4BlockScaling" in message
