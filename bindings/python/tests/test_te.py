"""The real TransformerEngine layers on libgtp (CUDA backend, one GPU, G = 1 with the machinery on:
machinery_at_g1=True, a real size-1 NCCL communicator), each trained 20 steps with AdamW next to the same TE layer without libgtp: losses,
outputs, input grads, weight grads and parameters bit for bit; the cache within (depth + 1) slots; under
Float8CurrentScaling with the FP8 wire TE's weight is libgtp's codes, byte for byte TE's own
quantization, and TE quantizes no weight itself. The NVFP4 (2D) and MXFP8 wires as TE's NVFP4Tensor /
MXFP8Tensor, checked as far as sm_90 allows (TE's NVFP4 / MXFP8 GEMMs need sm_100). Skips without a GPU
or without TE."""
import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gtp.torch as gt  # noqa: E402
from counting_library import count_library_calls  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the TransformerEngine tests need a GPU", allow_module_level=True)
te = pytest.importorskip("transformer_engine.pytorch", reason="TransformerEngine is not installed "
                         "(pip install transformer_engine[pytorch]; the GPU machine's copy: ../shared/te-h200)")
from transformer_engine.common import recipe as te_recipe  # noqa: E402
from transformer_engine.pytorch.quantized_tensor import Quantizer  # noqa: E402
from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer, Float8Tensor  # noqa: E402
import transformer_engine_torch as tex  # noqa: E402

HIDDEN, FFN, TOKENS, EXPERTS, STEPS, DEPTH = 256, 512, 64, 4, 20, 1
LAYERS = {
    "linear_column": lambda fuse: te.Linear(HIDDEN, FFN, parallel_mode="column", fuse_wgrad_accumulation=fuse,
                                            params_dtype=torch.bfloat16),
    "linear_row": lambda fuse: te.Linear(FFN, HIDDEN, parallel_mode="row", fuse_wgrad_accumulation=fuse,
                                         params_dtype=torch.bfloat16),
    "layernorm_linear": lambda fuse: te.LayerNormLinear(HIDDEN, FFN, fuse_wgrad_accumulation=fuse,
                                                        params_dtype=torch.bfloat16),
    "grouped_linear": lambda fuse: te.GroupedLinear(EXPERTS, HIDDEN, FFN, fuse_wgrad_accumulation=fuse,
                                                    params_dtype=torch.bfloat16),
}
# (wire, TE recipe or None for BF16 compute)
MODES = {"bf16": ("bf16", None), "fp8cs_bf16_wire": ("bf16", "fp8cs"), "fp8cs_fp8_wire": ("fp8", "fp8cs")}


def _weights(layer):
    names = [f"weight{i}" for i in range(EXPERTS)] if isinstance(layer, te.GroupedLinear) else ["weight"]
    return [getattr(layer, n) for n in names]


def _forward(layer, x, recipe):
    with te.autocast(enabled=recipe is not None, recipe=te_recipe.Float8CurrentScaling() if recipe else None):
        if isinstance(layer, te.GroupedLinear):
            return layer(x, [TOKENS // EXPERTS] * EXPERTS)
        return layer(x)


class _QuantizeCounter:
    """Records the shapes TE quantizes through Quantizer.quantize (its weight path, quantize_weight),
    per side: the reference layer's show the counter sees TE quantize a weight; the libgtp layer's
    must hold no weight."""

    def __init__(self, monkeypatch):
        self.shapes, self.side = {"ref": [], "gtp": []}, "ref"
        original = Quantizer.quantize

        def quantize(quantizer, tensor, *args, **kwargs):
            self.shapes[self.side].append(tuple(tensor.shape))
            return original(quantizer, tensor, *args, **kwargs)
        monkeypatch.setattr(Quantizer, "quantize", quantize)

    def counting(self, side):
        self.side = side


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("fuse", [False, True], ids=["grad", "main_grad"])
@pytest.mark.parametrize("kind", list(LAYERS))
def test_te_layer_trains_bit_identically_on_libgtp(tmp_path, monkeypatch, kind, fuse, mode):
    wire, recipe = MODES[mode]
    torch.manual_seed(0)
    ref = LAYERS[kind](fuse)
    torch.manual_seed(0)
    layer = LAYERS[kind](fuse)
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    with gt.Context(store, 0, 1, backend="cuda", prefetch_depth=DEPTH, machinery_at_g1=True) as ctx:
        sharded = gt.te.distribute(layer, ctx, wire=wire)
        assert sharded == _weights(layer) and all(isinstance(w, gt.ShardedParameter) for w in sharded)
        if fuse:
            for w in _weights(ref):  # TE's fused accumulation writes the caller's FP32 main_grad
                w.main_grad = torch.zeros_like(w, dtype=torch.float32)
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
        ctx.attach_optimizer(opt)
        counter = _QuantizeCounter(monkeypatch)
        in_features = FFN if kind == "linear_row" else HIDDEN
        for step in range(STEPS):
            x = torch.randn(TOKENS, in_features, device="cuda", dtype=torch.bfloat16,
                            generator=torch.Generator("cuda").manual_seed(step))
            x_ref, x_gtp = x.clone().requires_grad_(), x.clone().requires_grad_()
            counter.counting("ref")
            y_ref = _forward(ref, x_ref, recipe)
            loss_ref = y_ref.float().square().mean()
            loss_ref.backward()
            counter.counting("gtp")
            y = _forward(layer, x_gtp, recipe)
            loss = y.float().square().mean()
            loss.backward()
            assert torch.equal(loss, loss_ref) and torch.equal(y, y_ref), f"step {step}: forward"
            assert torch.equal(x_gtp.grad, x_ref.grad), f"step {step}: dgrad"
            for w_ref, w in zip(_weights(ref), _weights(layer)):
                if fuse:  # TE's fused path: the grad is in main_grad; .grad stays None (no dummy)
                    assert w.grad is None and w_ref.grad is None, f"step {step}: a dummy grad reached .grad"
                    assert torch.equal(w.main_grad, w_ref.main_grad), f"step {step}: main_grad"
                    for p in (w, w_ref):
                        p.grad = p.main_grad.to(p.dtype)
                        p.main_grad.zero_()
                else:
                    assert w.grad.dtype == w_ref.grad.dtype and torch.equal(w.grad, w_ref.grad), f"step {step}: grad"
            if fuse:  # declared zero: from step 1 on TE writes each weight's first wgrad straight into main_grad
                ctx.main_grads_zeroed(_weights(layer))
            opt_ref.step()
            opt.step()
            opt_ref.zero_grad()
            opt.zero_grad()
            for (name, p_ref), p in zip(ref.named_parameters(), layer.parameters()):
                assert torch.equal(p.detach(), p_ref.detach()), f"step {step}: parameter {name}"
            for group in ctx.stats()["groups"]:
                assert group["slots"] <= DEPTH + 1, (step, group)
        weight_shapes = {tuple(w.shape) for w in _weights(layer)}
        if wire == "fp8":
            assert not weight_shapes & set(counter.shapes["gtp"]), \
                f"TE quantized a libgtp weight itself: {counter.shapes['gtp']}"
            if kind != "grouped_linear":  # (GroupedLinear quantizes its weights in C++, out of the counter's sight)
                assert weight_shapes & set(counter.shapes["ref"]), "the counter sees TE quantize its own weight"
        elif recipe is None:
            assert not counter.shapes["gtp"] and not counter.shapes["ref"], "BF16 compute quantizes nothing"


@pytest.mark.parametrize("mode", ["bf16", "fp8cs_fp8_wire"])
@pytest.mark.parametrize("kind", list(LAYERS))
def test_te_layer_in_a_group_of_one_is_left_to_te(tmp_path, kind, mode):
    """The default at G = 1 (inert): distribute() leaves the TE layer as it is (its own weight, its own
    quantization under the recipe, its fused wgrad accumulation into main_grad), no call reaches
    libgtp (a CountingLibraryDouble between the context and libgtp), and it trains as TE without GTP,
    bit for bit."""
    wire, recipe = MODES[mode]
    torch.manual_seed(0)
    ref = LAYERS[kind](True)
    torch.manual_seed(0)
    layer = LAYERS[kind](True)
    own = _weights(layer)
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1, backend="cuda") as ctx:
        calls = count_library_calls(ctx)
        assert gt.te.distribute(layer, ctx, wire=wire) == [] and not ctx.parameters
        assert all(a is b and type(a) is torch.nn.Parameter for a, b in zip(_weights(layer), own))
        for w in _weights(ref) + _weights(layer):
            w.main_grad = torch.zeros_like(w, dtype=torch.float32)
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
        ctx.attach_optimizer(opt)
        in_features = FFN if kind == "linear_row" else HIDDEN
        for step in range(3):
            x = torch.randn(TOKENS, in_features, device="cuda", dtype=torch.bfloat16,
                            generator=torch.Generator("cuda").manual_seed(step))
            x_ref, x_gtp = x.clone().requires_grad_(), x.clone().requires_grad_()
            y_ref, y = _forward(ref, x_ref, recipe), _forward(layer, x_gtp, recipe)
            y_ref.float().square().mean().backward()
            y.float().square().mean().backward()
            ctx.drain()
            assert torch.equal(y, y_ref) and torch.equal(x_gtp.grad, x_ref.grad), f"step {step}"
            for w_ref, w in zip(_weights(ref), _weights(layer)):
                assert torch.equal(w.main_grad, w_ref.main_grad), f"step {step}: main_grad"
                for p in (w, w_ref):
                    p.grad = p.main_grad.to(p.dtype)
                    p.main_grad.zero_()
            ctx.main_grads_zeroed()
            opt_ref.step()
            opt.step()
            opt_ref.zero_grad()
            opt.zero_grad()
            for p_ref, p in zip(ref.parameters(), layer.parameters()):
                assert torch.equal(p.detach(), p_ref.detach()), f"step {step}: parameters"
        assert calls.total() == 0, f"calls reached libgtp at G = 1: {dict(calls.calls)}"


def test_fp8_wire_codes_are_te_current_scaling_byte_for_byte(tmp_path):
    torch.manual_seed(1)
    layer = te.Linear(HIDDEN, FFN, params_dtype=torch.bfloat16)
    weight = layer.weight.detach().clone()
    weight[3, 5] = 0.0  # edge values: a zero, the amax itself, a tiny value
    weight[7, 1] = weight.abs().max() * 2
    weight[9, 9] = 1e-30
    with torch.no_grad():
        layer.weight.copy_(weight)
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1,
                    backend="cuda", machinery_at_g1=True) as ctx:
        (w,) = gt.te.distribute(layer, ctx, wire="fp8")
        with te.autocast(enabled=True, recipe=te_recipe.Float8CurrentScaling()):
            ours = w.materialize_group_for_forward()
        assert isinstance(ours, Float8Tensor) and ours.requires_grad
        theirs = Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, weight.device, rowwise=True,
                                               columnwise=True)(weight)
        assert torch.equal(ours._data, theirs._data), "row-wise codes"
        assert torch.equal(ours._scale_inv, theirs._scale_inv), "decode scale"
        assert torch.equal(ours._transpose, theirs._transpose), "column-wise (transposed) codes"
        assert torch.equal(ours.dequantize(), theirs.dequantize())
        ctx.drain()


def test_refusals_name_the_fix(tmp_path):
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1,
                    backend="cuda", machinery_at_g1=True) as ctx:
        mlp = te.LayerNormMLP(HIDDEN, FFN, params_dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="LayerNormMLP calls no DistributedWeight hook"):
            gt.te.distribute(torch.nn.Sequential(te.Linear(HIDDEN, HIDDEN), mlp), ctx)
        assert not ctx.parameters, "a refusal registers nothing"
        split = te.Linear(HIDDEN, FFN, parameters_split=("a", "b"))
        with pytest.raises(ValueError, match="parameters_split"):
            gt.te.distribute(split, ctx)
        delayed = te.Linear(HIDDEN, FFN, delay_wgrad_compute=True)
        with pytest.raises(ValueError, match="delay_wgrad_compute=True"):
            gt.te.distribute(delayed, ctx)
        layer = te.Linear(HIDDEN, FFN, params_dtype=torch.bfloat16)
        gt.te.distribute(layer, ctx, wire="fp8")
        x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16)
        for recipe in (te_recipe.DelayedScaling(), te_recipe.Float8BlockScaling()):
            with pytest.raises(ValueError, match="register the weight with wire='bf16'"):
                with te.autocast(enabled=True, recipe=recipe):
                    layer(x)
        ctx.drain()


@pytest.mark.parametrize("recipe_name", ["DelayedScaling", "Float8BlockScaling"])
def test_bf16_wire_under_other_recipes(tmp_path, recipe_name):
    """te.Linear quantizes the gathered BF16 weight itself under any recipe: it trains as TE without GTP
    (bounded: delayed scaling re-quantizes the re-gathered weight in backward where TE without GTP
    keeps its forward workspace); LayerNormLinear would feed it to dgrad unquantized: refused."""
    recipe = getattr(te_recipe, recipe_name)()
    torch.manual_seed(0)
    ref = te.Linear(HIDDEN, FFN, params_dtype=torch.bfloat16)
    torch.manual_seed(0)
    layer = te.Linear(HIDDEN, FFN, params_dtype=torch.bfloat16)
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1,
                    backend="cuda", machinery_at_g1=True) as ctx:
        gt.te.distribute(layer, ctx)
        for step in range(3):
            x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16,
                            generator=torch.Generator("cuda").manual_seed(step))
            losses = []
            for module in (ref, layer):
                with te.autocast(enabled=True, recipe=recipe):
                    loss = module(x).float().square().mean()
                loss.backward()
                losses.append(loss.detach())
            torch.testing.assert_close(losses[1], losses[0], rtol=1e-2, atol=0)
            torch.testing.assert_close(layer.weight.grad.float(), ref.weight.grad.float(), rtol=0.1, atol=1e-3)
            layer.weight.grad = ref.weight.grad = None
        lnl = te.LayerNormLinear(HIDDEN, FFN, params_dtype=torch.bfloat16)
        gt.te.distribute(lnl, ctx)
        with te.autocast(enabled=True, recipe=recipe):
            y = lnl(torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="layernorm_linear feeds a re-gathered distributed weight"):
            y.float().sum().backward()
        ctx.drain()


def test_mxfp8_wire_codes_against_te_quantizer_where_it_runs(tmp_path):
    """The MXFP8 wire's GEMM-layout codes and row-major E8M0 scales against TE's own MXFP8Quantizer
    (row-wise) on the same BF16 weight, where TE's MXFP8 kernels run (sm_100). On the H200 (sm_90)
    TE 2.20's quantizer returns without error but leaves the data unwritten, and its dequantize
    refuses: probed by the dequantize, the test then skips."""
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    torch.manual_seed(2)
    weight = torch.randn(FFN, HIDDEN, device="cuda").to(torch.bfloat16)
    weight[0, :32] = 0.0  # an all-zero block
    try:
        theirs = MXFP8Quantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=False)(weight)
        theirs.dequantize()  # raises where TE has no MXFP8 kernels
        torch.cuda.synchronize()
    except RuntimeError as error:
        pytest.skip(f"TE's MXFP8 quantizer does not run on {torch.cuda.get_device_name()}: {error}")
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1, backend="cuda") as ctx:
        w = gt.ShardedParameter(weight.clone(), ctx, "w", FFN, HIDDEN, wire="mxfp8")
        ctx.shard_updated([w])
        (view,) = w.materialize_group_views(layout="gemm")
        assert torch.equal(view.data.tensor[:FFN], theirs._rowwise_data), "E4M3 codes"
        assert torch.equal(view.scales.tensor[:FFN], theirs._rowwise_scale_inv[:FFN, :HIDDEN // 32]), "E8M0 scales"
        w.release_group("gemm")


def _edge_weight(rows, cols, seed):
    """A random BF16 weight with an all-zero 16x16 tile, a tiny value, a large one and a tile far below the
    amax (E4M3-subnormal tile scales)."""
    torch.manual_seed(seed)
    weight = torch.randn(rows, cols, device="cuda").to(torch.bfloat16)
    weight[:16, :16] = 0.0
    weight[20, 3] = 1e-30
    weight[5, cols - 1] = 300.0
    weight[rows - 16:, cols - 16:] *= 1e-4
    return weight


def _te_quantized_weight(monkeypatch, ctx, weight, recipe, **register):
    """What the weight's forward hands TE under `recipe`. TE's autocast refuses MXFP8 / NVFP4 recipes below
    sm_100, so the recipe TE's autocast would report is patched in (gtp.torch reads nothing else of it)."""
    from gtp.torch import te_quantized
    rows, cols = weight.shape
    w = gt.ShardedParameter(weight.clone(), ctx, f"w{len(ctx.parameters)}", rows, cols, **register)
    ctx.shard_updated([w])
    monkeypatch.setattr(te_quantized, "_active_recipe", lambda: recipe)
    return w, w.materialize_group_for_forward()


def _nvfp4_copy(tensor, columnwise):
    """A new NVFP4Tensor on copies of `tensor`'s row-wise (and column-wise) data, scales and amax."""
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Tensor

    def copy(name):
        return getattr(tensor, name).clone() if columnwise or "columnwise" not in name else None
    return NVFP4Tensor(shape=tuple(tensor.shape), dtype=torch.bfloat16, rowwise_data=copy("_rowwise_data"),
                       rowwise_scale_inv=copy("_rowwise_scale_inv"), columnwise_data=copy("_columnwise_data"),
                       columnwise_scale_inv=copy("_columnwise_scale_inv"), amax_rowwise=copy("_amax_rowwise"),
                       amax_columnwise=copy("_amax_columnwise"), fp4_dtype=tex.DType.kFloat4E2M1,
                       quantizer=tensor._quantizer, with_gemm_swizzled_scales=tensor._with_gemm_swizzled_scales)


def _assert_te_allocation(ours, quantizer, shape):
    """Every inner tensor of `ours` has the shape and dtype TE's quantizer allocates for `shape`."""
    for name, (want_shape, want_dtype) in quantizer.inner_tensor_specs(shape).items():
        got = getattr(ours, name)
        assert tuple(got.shape) == tuple(want_shape) and got.dtype == want_dtype, (name, got.shape, want_shape)
    try:
        empty = quantizer.make_empty(shape, dtype=torch.bfloat16, device="cuda")
    except RuntimeError as error:  # (allocation only: expected to run on any GPU)
        warnings.warn(f"make_empty refused on {torch.cuda.get_device_name()}: {error}")
        return
    for name in quantizer.inner_tensor_specs(shape):
        assert tuple(getattr(empty, name).shape) == tuple(getattr(ours, name).shape), name
        assert getattr(empty, name).dtype == getattr(ours, name).dtype, name
    assert empty._with_gemm_swizzled_scales == ours._with_gemm_swizzled_scales


@pytest.mark.parametrize("shape", [(FFN, HIDDEN), (144, 80)], ids=["512x256", "144x80_padded"])
def test_nvfp4_2d_wire_is_te_nvfp4_weight_quantization_byte_for_byte(tmp_path, monkeypatch, shape):
    """Under NVFP4BlockScaling the 2D NVFP4 wire becomes an NVFP4Tensor whose codes, tile scales, transpose,
    transposed scales and amax equal TE's reference quantizer configured as the recipe configures it for
    weights (16x16 tiles, no RHT, no stochastic rounding) byte for byte, laid out as TE allocates it.
    144 x 80: scales padded to 256 x 8 (row-wise) and 128 x 12 (column-wise)."""
    from transformer_engine.pytorch.custom_recipes import reference_utils
    from transformer_engine.pytorch.custom_recipes.reference_nvfp4 import NVFP4QuantizerRef
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer, NVFP4Tensor
    rows, cols = shape
    weight = _edge_weight(rows, cols, seed=3)
    recipe = te_recipe.NVFP4BlockScaling()
    assert recipe.fp4_quant_fwd_weight.fp4_2d_quantization and not recipe.fp4_quant_fwd_weight.stochastic_rounding
    assert not recipe.fp4_quant_fwd_weight.random_hadamard_transform
    ref = NVFP4QuantizerRef(dtype=reference_utils.Fp4Formats.E2M1, rowwise=True, columnwise=True,
                            quant_tile_shape=(16, 16), pow_2_scales=False, with_rht=False).quantize(weight)
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1, backend="cuda") as ctx:
        w, ours = _te_quantized_weight(monkeypatch, ctx, weight, recipe, wire="nvfp4", nvfp4_2d=True)
        assert isinstance(ours, NVFP4Tensor) and ours.requires_grad and tuple(ours.shape) == shape
        assert torch.equal(ours._rowwise_data, ref.data), "row-wise E2M1 codes"
        assert torch.equal(ours._columnwise_data, ref.data_t), "column-wise (transposed) codes"
        scales, scales_t = ours._rowwise_scale_inv, ours._columnwise_scale_inv
        assert torch.equal(scales[:rows, :cols // 16], ref.scale.view(torch.uint8)), "row-wise tile scales"
        assert torch.equal(scales_t[:cols, :rows // 16], ref.scale_t.view(torch.uint8)), "column-wise tile scales"
        assert not scales[rows:].any() and not scales[:, cols // 16:].any(), "row-wise scale padding"
        assert not scales_t[cols:].any() and not scales_t[:, rows // 16:].any(), "column-wise scale padding"
        assert torch.equal(ours._amax_rowwise, ref.global_amax_row), "amax"
        assert torch.equal(ours._amax_columnwise, ref.global_amax_col), "column-wise amax"
        _assert_te_allocation(ours, NVFP4Quantizer(tex.DType.kFloat4E2M1, rowwise=True, columnwise=True,
                                                   with_2d_quantization=True), shape)
        # TE's own way to the column-wise usage (its nibble transpose and 2D scale transpose kernels)
        rowwise = _nvfp4_copy(ours, columnwise=False)
        try:
            rowwise.update_usage(rowwise_usage=True, columnwise_usage=True)
            torch.cuda.synchronize()
        except RuntimeError as error:
            warnings.warn(f"TE's NVFP4 transpose refused on {torch.cuda.get_device_name()}: {error}")
        else:
            assert torch.equal(rowwise._columnwise_data, ours._columnwise_data), "TE's transpose of our codes"
            assert torch.equal(rowwise._columnwise_scale_inv[:cols, :rows // 16], scales_t[:cols, :rows // 16])
        try:
            decoded = ours.dequantize()
            torch.cuda.synchronize()
        except RuntimeError as error:
            warnings.warn(f"TE's NVFP4 dequantize refused on {torch.cuda.get_device_name()}: {error}")
        else:  # TE decodes with amax / 2688, libgtp with 1 / (2688 / amax): equal up to the BF16 rounding
            full = ctx.view_at(ctx.materialize([w.gtp_weight], "forward", stream=ctx.stream())[0], shape,
                               torch.bfloat16).clone()
            ctx.release([w.gtp_weight], stream=ctx.stream(), layout="bf16")
            torch.testing.assert_close(decoded.float(), full.float(), rtol=2 ** -7, atol=0)
        back = w.materialize_group_for_backward()  # dgrad: the forward's recipe, both usages again
        assert isinstance(back, NVFP4Tensor) and torch.equal(back._columnwise_data, ref.data_t)
        ctx.drain()


def test_nvfp4_blocked_scales_are_te_gemm_swizzle(tmp_path, monkeypatch):
    """gemm_scales="blocked_128x4" hands TE the slot's scales as GEMM-swizzled (no copy): they equal TE's own
    swizzle (tex.swizzle_scales_for_gemm_) of the row-major NVFP4Tensor, both usages."""
    rows, cols = 144, 80
    weight = _edge_weight(rows, cols, seed=4)
    recipe = te_recipe.NVFP4BlockScaling()
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1, backend="cuda") as ctx:
        _, plain = _te_quantized_weight(monkeypatch, ctx, weight, recipe, wire="nvfp4", nvfp4_2d=True)
        want = _nvfp4_copy(plain, columnwise=True)
        try:
            tex.swizzle_scales_for_gemm_(want)
            torch.cuda.synchronize()
        except RuntimeError as error:
            pytest.skip(f"TE's scale swizzle does not run on {torch.cuda.get_device_name()}: {error}")
        _, ours = _te_quantized_weight(monkeypatch, ctx, weight, recipe, wire="nvfp4", nvfp4_2d=True,
                                       gemm_scales="blocked_128x4")
        assert ours._with_gemm_swizzled_scales and want._with_gemm_swizzled_scales
        assert torch.equal(ours._rowwise_data, want._rowwise_data)
        assert torch.equal(ours._rowwise_scale_inv, want._rowwise_scale_inv), "row-wise swizzled scales"
        assert torch.equal(ours._columnwise_scale_inv, want._columnwise_scale_inv), "column-wise swizzled scales"
        ctx.drain()


def test_mxfp8_blocked_scales_are_te_gemm_swizzle(tmp_path, monkeypatch):
    """gemm_scales="blocked_128x4" on the MXFP8 wire: the slot's scales, handed over as GEMM-swizzled, equal
    TE's own swizzle of the row-major MXFP8Tensor."""
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Tensor
    rows, cols = 96, 160
    weight = _edge_weight(rows, cols, seed=6)
    recipe = te_recipe.MXFP8BlockScaling()
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1, backend="cuda") as ctx:
        _, plain = _te_quantized_weight(monkeypatch, ctx, weight, recipe, wire="mxfp8")
        want = MXFP8Tensor(shape=(rows, cols), dtype=torch.bfloat16, rowwise_data=plain._rowwise_data.clone(),
                           rowwise_scale_inv=plain._rowwise_scale_inv.clone(), columnwise_data=None,
                           columnwise_scale_inv=None, fp8_dtype=tex.DType.kFloat8E4M3, quantizer=plain._quantizer,
                           with_gemm_swizzled_scales=False)
        try:
            tex.swizzle_scales_for_gemm_(want)
            torch.cuda.synchronize()
        except RuntimeError as error:
            pytest.skip(f"TE's scale swizzle does not run on {torch.cuda.get_device_name()}: {error}")
        _, ours = _te_quantized_weight(monkeypatch, ctx, weight, recipe, wire="mxfp8", gemm_scales="blocked_128x4")
        assert ours._with_gemm_swizzled_scales and want._with_gemm_swizzled_scales
        assert torch.equal(ours._rowwise_data, want._rowwise_data)
        assert torch.equal(ours._rowwise_scale_inv, want._rowwise_scale_inv), "swizzled E8M0 scales"
        ctx.drain()


@pytest.mark.parametrize("shape", [(FFN, HIDDEN), (96, 160)], ids=["512x256", "96x160_padded"])
def test_mxfp8_wire_is_te_mxfp8_tensor_forward_only(tmp_path, monkeypatch, shape):
    """Under MXFP8BlockScaling the MXFP8 wire becomes a row-wise MXFP8Tensor on the slot's codes with the
    E8M0 scales in TE's (padded) layout; its backward is refused with the fix."""
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer, MXFP8Tensor
    rows, cols = shape
    weight = _edge_weight(rows, cols, seed=5)
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1, backend="cuda") as ctx:
        probe = gt.ShardedParameter(weight.clone(), ctx, "probe", rows, cols, wire="mxfp8")
        ctx.shard_updated([probe])
        (view,) = probe.materialize_group_views(layout="gemm")
        codes, compact = view.data.tensor[:rows].clone(), view.scales.tensor[:rows].clone()
        probe.release_group("gemm")
        w, ours = _te_quantized_weight(monkeypatch, ctx, weight, te_recipe.MXFP8BlockScaling(), wire="mxfp8")
        assert isinstance(ours, MXFP8Tensor) and ours.requires_grad and tuple(ours.shape) == shape
        assert ours._columnwise_data is None and not ours._quantizer.columnwise_usage
        assert torch.equal(ours._rowwise_data, codes), "E4M3 codes"
        scales = ours._rowwise_scale_inv
        assert torch.equal(scales[:rows, :cols // 32], compact), "E8M0 scales"
        assert not scales[rows:].any() and not scales[:, cols // 32:].any(), "scale padding"
        _assert_te_allocation(ours, MXFP8Quantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=False), shape)
        with pytest.raises(ValueError, match="32x1 blocks"):
            w.materialize_group_for_backward()
        ctx.drain()
