"""TE's quantized weight tensors built on libgtp's gathered wire codes, so that under a TE FP8 recipe the
weight TE receives is already quantized (one collective, no BF16 copy, no re-quantization).

Only consulted once transformer_engine.pytorch is imported (gtp.torch never imports TE itself).
Which recipe goes with which wire (docs/python.md, "TransformerEngine"):
- no TE quantization active: the BF16 weight;
- the BF16 wire under a TE recipe: the BF16 weight in forward (TE quantizes it); in backward TE 2.20's
  LayerNormLinear and GroupedLinear feed a re-gathered weight to the dgrad GEMM as it is (only Linear
  quantizes it), so under Float8CurrentScaling the weight is handed over quantized by TE's own
  current-scaling quantizer (what Linear would do), and under other recipes those two layers are
  refused with the fix;
- Float8CurrentScaling with the FP8 wire: a Float8Tensor on the codes, their exact transpose and the
  decode scale (libgtp's per-tensor rule is TE's current scaling: scale = 448 / amax);
- NVFP4BlockScaling with the NVFP4 wire in 16x16 blocks: an NVFP4Tensor on the codes, their exact
  transpose, the tile scales in TE's layout (TE quantizes weights in 16x16 tiles under that recipe) and
  the group-reduced amax libgtp packed the weight with (gtp_weight_amax), at any G;
- MXFP8BlockScaling with the MXFP8 wire: an MXFP8Tensor with the row-wise usage only, for the forward
  GEMM; its backward is refused (TE's dgrad takes 32x1 blocks, which the 1x32 wire cannot give);
- any other recipe with a quantized wire: refused, naming both and what to use instead."""
import os
import sys

import torch

FP8_CURRENT = "float8_current_scaling"  # a Float8Tensor on the FP8 wire's codes
QUANTIZE_BF16 = "quantize_bf16"          # the gathered BF16 weight quantized by TE's current-scaling quantizer
NVFP4_2D = "nvfp4_2d"                    # an NVFP4Tensor on the 2D NVFP4 wire's codes
MXFP8_ROWWISE = "mxfp8_rowwise"          # an MXFP8Tensor (row-wise usage) on the MXFP8 wire's codes
GEMM_LAYOUTS = (FP8_CURRENT, NVFP4_2D, MXFP8_ROWWISE)  # served from the GEMM-ready layout
_TE_MODULES = os.sep + os.path.join("transformer_engine", "pytorch", "module") + os.sep


_FP8_STATE = []  # TE's FP8GlobalStateManager, once TE is imported


def _active_recipe():
    """TE's active recipe while TE quantizes (autocast), else None; None also when TE is not imported."""
    if not _FP8_STATE:  # looked up once: an import statement costs microseconds on every materialize
        if sys.modules.get("transformer_engine.pytorch") is None:
            return None
        from transformer_engine.pytorch.quantization import FP8GlobalStateManager
        _FP8_STATE.append(FP8GlobalStateManager)
    manager = _FP8_STATE[0]
    return manager.get_fp8_recipe() if manager.is_fp8_enabled() else None


def phase_recipe(param, phase):
    """The TE recipe `param`'s materialization in `phase` serves. TE's autocast wraps the forward only
    and its backward runs under the recipe the forward saw (ctx.fp8_recipe), so a backward
    materialization takes the recipe of this weight's last forward."""
    if phase == "forward":
        param._te_recipe = _active_recipe()
    return getattr(param, "_te_recipe", None)


def _te_caller():
    """The file name of the nearest calling frame in TE's pytorch/module/ folder (the TE layer that
    called the protocol), or "" when no TE layer is on the stack."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if _TE_MODULES in name:
            return os.path.basename(name)
        frame = frame.f_back
    return ""


def _check_weight_qparams(recipe, name):
    weight_q = recipe.fp8_quant_fwd_weight
    if weight_q.power_2_scale or weight_q.amax_epsilon != 0.0:
        raise ValueError(f"weight '{name}': libgtp quantizes with scale = 448 / amax, but this "
                         f"Float8CurrentScaling recipe asks power_2_scale={weight_q.power_2_scale}, "
                         f"amax_epsilon={weight_q.amax_epsilon} for weights; use the recipe's defaults "
                         "(NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES unset)")


def recipe_layout(param, phase):
    """What `param` (a ShardedParameter) is handed to TE as in `phase`: None for BF16, FP8_CURRENT for a
    Float8Tensor on the wire's codes, QUANTIZE_BF16 for the BF16 weight quantized by TE's quantizer.
    Raises ValueError for a wire under a TE recipe it cannot serve."""
    recipe = phase_recipe(param, phase)
    if recipe is None:
        return None
    name, wire = param.gtp_weight.name, param.gtp_weight.wire  # the wire libgtp resolved (a profile's)
    if wire == "bf16":
        if phase != "backward":
            return None
        if recipe.float8_current_scaling():
            _check_weight_qparams(recipe, name)
            return QUANTIZE_BF16
        caller = _te_caller()
        if caller in ("layernorm_linear.py", "grouped_linear.py"):
            raise ValueError(f"weight '{name}': TE 2.20's {caller[:-3]} feeds a re-gathered distributed weight "
                             f"to its dgrad GEMM unquantized, which fails under {type(recipe).__name__}; use "
                             "Float8CurrentScaling (libgtp then hands over the weight quantized), or te.Linear")
        return None
    if wire == "fp8" and recipe.float8_current_scaling():
        _check_weight_qparams(recipe, name)
        rows, cols = param.full_shape
        if rows % 16 or cols % 16:
            raise ValueError(f"weight '{name}' is {rows} x {cols}: TE's FP8 GEMMs need both dimensions to be "
                             "multiples of 16; use the BF16 wire for it")
        return FP8_CURRENT
    if wire == "nvfp4" and recipe.nvfp4():
        _check_nvfp4(param, recipe, name)
        return NVFP4_2D
    if wire == "mxfp8" and recipe.mxfp8():
        _check_mxfp8(param, recipe, phase, name)
        return MXFP8_ROWWISE
    raise ValueError(f"weight '{name}' travels on the {wire} wire, which cannot serve TE's "
                     f"{type(recipe).__name__} recipe: the FP8 wire serves Float8CurrentScaling, the NVFP4 wire "
                     "with nvfp4_2d=True NVFP4BlockScaling, the MXFP8 wire MXFP8BlockScaling (forward only); under "
                     f"{type(recipe).__name__} register the weight with wire='bf16' (TE then quantizes the "
                     "gathered BF16 weight itself)")


def _check_nvfp4(param, recipe, name):
    """Refuses an NVFP4 wire that TE's NVFP4Tensor for this weight under `recipe` cannot be built on."""
    weight_q = recipe.fp4_quant_fwd_weight
    if not param.gtp_weight.nvfp4_2d:
        raise ValueError(f"weight '{name}' travels on the NVFP4 wire in 1x16 blocks: TE's dgrad under "
                         "NVFP4BlockScaling takes the weight's column-wise (transposed) usage, which only 16x16 "
                         "blocks give exactly; register it with nvfp4_2d=True (profile nvfp4_blocks: \"2d\")")
    if not weight_q.fp4_2d_quantization or weight_q.random_hadamard_transform or weight_q.stochastic_rounding \
            or recipe.nvfp4_4over6 in ("weights", "all"):
        raise ValueError(f"weight '{name}': libgtp's NVFP4 wire is TE's 16x16 weight quantization without RHT, "
                         "stochastic rounding or 4over6, but this NVFP4BlockScaling recipe asks "
                         f"fp4_2d_quantization={weight_q.fp4_2d_quantization}, "
                         f"random_hadamard_transform={weight_q.random_hadamard_transform}, "
                         f"stochastic_rounding={weight_q.stochastic_rounding}, nvfp4_4over6={recipe.nvfp4_4over6!r} "
                         "for weights; use the recipe's defaults (NVTE_NVFP4_DISABLE_2D_QUANTIZATION and "
                         "NVTE_NVFP4_4OVER6 unset)")
    rows, cols = param.full_shape
    if rows % 16 or cols % 16:
        raise ValueError(f"weight '{name}' is {rows} x {cols}: TE's NVFP4 tensors need both dimensions to be "
                         "multiples of 16; use the BF16 wire for it")


def _check_mxfp8(param, recipe, phase, name):
    """Refuses an MXFP8 wire that TE's MXFP8Tensor for this weight under `recipe` cannot be built on."""
    if phase == "backward":
        raise ValueError(f"weight '{name}': TE's dgrad under MXFP8BlockScaling takes the weight quantized in 32x1 "
                         "blocks (down columns), a different quantization that the MXFP8 wire (1x32 blocks along "
                         "rows) cannot give; train with wire='bf16' under MXFP8BlockScaling (TE quantizes the "
                         "gathered weight both ways), and keep the MXFP8 wire for forward-only use")
    if recipe.enable_2d_quantization:
        raise ValueError(f"weight '{name}': this MXFP8BlockScaling recipe quantizes weights in 2D blocks "
                         "(enable_2d_quantization=True), the MXFP8 wire in 1x32 blocks; use the recipe's default")
    if param.gtp_weight.mx_rounding != "rceil":
        raise ValueError(f"weight '{name}': the MXFP8 wire uses mx_rounding={param.gtp_weight.mx_rounding!r}, "
                         "TE's MXFP8 scales RCEIL; register it with mx_rounding='rceil' (the default)")
    rows, cols = param.full_shape
    if rows % 32 or cols % 32:
        raise ValueError(f"weight '{name}' is {rows} x {cols}: TE's MXFP8 tensors need both dimensions to be "
                         "multiples of 32; use the BF16 wire for it")


def quantize_bf16(tensor, member):
    """TE's current-scaling quantization of a gathered BF16 weight, both usages (forward and dgrad)."""
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer
    quantizer = Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, tensor.device, rowwise=True, columnwise=True)
    out = quantizer(tensor)
    out.requires_grad_(member.requires_grad)
    return out


def float8_tensor(view, member):
    """TE's Float8Tensor over one gathered FP8 weight's GEMM-layout sections (a gtp.Materialized whose
    sections carry `.tensor`), requires_grad as `member`'s."""
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer, Float8Tensor
    rows, cols = view.rows, view.cols
    data = view.data.tensor[:rows]                # E4M3 codes [rows, cols]
    data_t = view.data_t.tensor[:, :rows]         # their exact transpose [cols, rows]
    scale_inv = view.decode_scales.tensor.reshape(-1)[:1]  # 1 / scale, every chunk's equal
    quantizer = Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, data.device, rowwise=True, columnwise=True)
    return Float8Tensor(shape=(rows, cols), dtype=torch.bfloat16, data=data, fp8_scale_inv=scale_inv,
                        fp8_dtype=tex.DType.kFloat8E4M3, data_transpose=data_t, quantizer=quantizer,
                        requires_grad=member.requires_grad, device=data.device)


def gemm_tensors(context, layout, views, members):
    """TE's quantized tensors (`layout` one of GEMM_LAYOUTS) over one group's GEMM-layout views, one per
    member. One tensor per slot, built on its first materialize (TE only ever adds usages to a weight's
    quantized tensor, never drops one, so the cached tensor stays whole); what lives outside the slot
    (scales copied into TE's padded layout, the NVFP4 amax) is refreshed at every materialize."""
    make = {FP8_CURRENT: float8_tensor, NVFP4_2D: nvfp4_tensor, MXFP8_ROWWISE: mxfp8_tensor}[layout]
    tensors = []
    for view, member in zip(views, members):
        key = (layout, tuple(s.address for s in view.sections().values()), view.rows, view.cols,
               view.scale_layout, member.requires_grad)
        tensor = context.cached_view(key, lambda view=view, member=member: make(view, member))
        if layout != FP8_CURRENT:
            _refresh(tensor, view, member)
        tensors.append(tensor)
    return tensors


def nvfp4_scale_shape(rows, cols, columnwise):
    """TE's NVFP4 scale_inv shape for a rows x cols tensor (NVFP4Quantizer.get_scale_shape)."""
    outer, inner = (cols, rows) if columnwise else (rows, cols)
    return _round_up(outer, 128), _round_up(-(-inner // 16), 4)


def mxfp8_scale_shape(rows, cols):
    """TE's row-wise MXFP8 scale_inv shape for a rows x cols tensor (MXFP8Quantizer.get_scale_shape)."""
    return _round_up(rows, 128), _round_up(cols // 32, 4)


def _round_up(value, multiple):
    return -(-value // multiple) * multiple


def _blocked(view):
    return view.scale_layout == "blocked_128x4"


def nvfp4_tensor(view, member):
    """TE's NVFP4Tensor over one gathered 2D NVFP4 weight: row-wise codes and their exact transpose
    from the slot; scales in TE's layout (each 16x16 tile's E4M3 scale on its 16 rows, zero-padded to
    128 x 4 multiples), the slot's own with blocked_128x4 scales (TE's GEMM-swizzled order), else
    copied at every materialize; the amax libgtp packed it with (see weight_amax)."""
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer, NVFP4Tensor
    rows, cols = view.rows, view.cols
    device = view.data.tensor.device
    if _blocked(view):
        scales, scales_t = view.scales.tensor, view.scales_t.tensor
    else:
        scales = torch.zeros(nvfp4_scale_shape(rows, cols, False), dtype=torch.uint8, device=device)
        scales_t = torch.zeros(nvfp4_scale_shape(rows, cols, True), dtype=torch.uint8, device=device)
    for got, want in ((scales, nvfp4_scale_shape(rows, cols, False)), (scales_t, nvfp4_scale_shape(rows, cols, True))):
        if tuple(got.shape) != want:  # a layout this code does not know: never hand TE a wrong one
            raise RuntimeError(f"NVFP4 scales of '{member.gtp_weight.name}' are {tuple(got.shape)}, TE's layout "
                               f"{want}: libgtp's blocked_128x4 layout no longer matches TE's")
    quantizer = NVFP4Quantizer(tex.DType.kFloat4E2M1, rowwise=True, columnwise=True, with_2d_quantization=True)
    amax = weight_amax(member)
    return NVFP4Tensor(shape=(rows, cols), dtype=torch.bfloat16, rowwise_data=view.data.tensor[:rows],
                       rowwise_scale_inv=scales, columnwise_data=view.data_t.tensor,
                       columnwise_scale_inv=scales_t, amax_rowwise=amax, amax_columnwise=amax,
                       fp4_dtype=tex.DType.kFloat4E2M1, quantizer=quantizer,
                       with_gemm_swizzled_scales=_blocked(view), requires_grad=member.requires_grad, device=device)


def mxfp8_tensor(view, member):
    """TE's MXFP8Tensor over one gathered MXFP8 weight, row-wise usage only (the forward GEMM): the slot's
    E4M3 codes; the E8M0 scales in TE's layout (zero-padded to 128 x 4 multiples): the slot's own where
    that is already TE's shape or with blocked_128x4 scales (GEMM-swizzled), else copied at every
    materialize."""
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer, MXFP8Tensor
    rows, cols = view.rows, view.cols
    want = mxfp8_scale_shape(rows, cols)
    scales = view.scales.tensor if _blocked(view) else view.scales.tensor[:rows]
    if tuple(scales.shape) != want:
        if _blocked(view):
            raise RuntimeError(f"MXFP8 scales of '{member.gtp_weight.name}' are {tuple(scales.shape)}, TE's "
                               f"layout {want}: libgtp's blocked_128x4 layout no longer matches TE's")
        scales = torch.zeros(want, dtype=torch.uint8, device=scales.device)
    quantizer = MXFP8Quantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=False)
    return MXFP8Tensor(shape=(rows, cols), dtype=torch.bfloat16, rowwise_data=view.data.tensor[:rows],
                       rowwise_scale_inv=scales, columnwise_data=None, columnwise_scale_inv=None,
                       fp8_dtype=tex.DType.kFloat8E4M3, quantizer=quantizer, with_gemm_swizzled_scales=_blocked(view),
                       requires_grad=member.requires_grad, device=scales.device)


def _refresh(tensor, view, member):
    """Brings what a cached NVFP4 / MXFP8 tensor keeps outside the slot up to this materialize."""
    rows, cols = view.rows, view.cols
    if hasattr(tensor, "_amax_rowwise"):  # NVFP4
        tensor._amax_rowwise = tensor._amax_columnwise = weight_amax(member)
        if not _blocked(view):  # each 16x16 tile's scale on its 16 rows (columns for the transpose)
            tensor._rowwise_scale_inv[:rows, :cols // 16].unflatten(0, (rows // 16, 16)).copy_(
                view.scales.tensor[:rows // 16].unsqueeze(1).expand(-1, 16, -1))
            tensor._columnwise_scale_inv[:cols, :rows // 16].unflatten(0, (cols // 16, 16)).copy_(
                view.scales_t.tensor[:, :rows // 16].unsqueeze(1).expand(-1, 16, -1))
    elif not _blocked(view) and tensor._rowwise_scale_inv.data_ptr() != view.scales.address:
        tensor._rowwise_scale_inv[:rows, :cols // 32].copy_(view.scales.tensor[:rows])


def weight_amax(member):
    """The amax libgtp packed `member`'s NVFP4 wire with, as TE's NVFP4Tensor keeps it (FP32 [1], TE's GEMM
    and dequantize take amax / 2688): the largest finite |x| of the whole weight, reduced over the group
    by the weight's latest shard_updated (docs/formats.md): for a finite weight, TE's own global amax.
    Copied from libgtp's amax slot (gtp_weight_amax) into a tensor of the parameter's own, on the current
    stream, after the materialize that orders the slot there; TE's tensors never point into libgtp's
    array, which a later registration may move. An update of the shard without shard_updated, which
    leaves the wire as it was, leaves this amax as it was too."""
    context = member.context
    slot = context.view_at(context.weight_amax(member.gtp_weight), (1,), torch.float32)
    amax = getattr(member, "_te_amax", None)
    if amax is None:
        amax = member._te_amax = torch.empty(1, dtype=torch.float32, device=context.device)
    return amax.copy_(slot)
