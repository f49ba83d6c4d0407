"""TE's quantized weight tensors built on libgtp's gathered wire codes, so that under a TE FP8 recipe the
weight TE receives is already quantized (one collective, no BF16 copy, no re-quantization).

Only consulted once transformer_engine.pytorch is imported: gtp.torch never imports TE itself.
Which recipe goes with which wire (docs/python.md, "TransformerEngine"):
- no TE quantization active: the BF16 weight;
- the BF16 wire under a TE recipe: the BF16 weight in forward (TE quantizes it); in backward TE 2.20's
  LayerNormLinear and GroupedLinear feed a re-gathered weight to the dgrad GEMM as it is (only Linear
  quantizes it), so under Float8CurrentScaling the weight is handed over quantized by TE's own
  current-scaling quantizer (what Linear would do), and under other recipes those two layers are
  refused with the fix;
- Float8CurrentScaling with the FP8 wire: a Float8Tensor on the codes, their exact transpose and the
  decode scale (libgtp's per-tensor rule is TE's current scaling: scale = 448 / amax);
- any other recipe with a quantized wire: refused, naming both and what to use instead."""
import os
import sys

import torch

FP8_CURRENT = "float8_current_scaling"  # a Float8Tensor on the FP8 wire's codes
QUANTIZE_BF16 = "quantize_bf16"          # the gathered BF16 weight quantized by TE's current-scaling quantizer
_TE_MODULES = os.sep + os.path.join("transformer_engine", "pytorch", "module") + os.sep


def _active_recipe():
    """TE's active recipe while TE quantizes (autocast), else None; None also when TE is not imported."""
    te = sys.modules.get("transformer_engine.pytorch")
    if te is None:
        return None
    from transformer_engine.pytorch.quantization import FP8GlobalStateManager
    return FP8GlobalStateManager.get_fp8_recipe() if FP8GlobalStateManager.is_fp8_enabled() else None


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
    name = param.gtp_weight.name
    if param.wire == "bf16":
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
    if param.wire == "fp8" and recipe.float8_current_scaling():
        _check_weight_qparams(recipe, name)
        rows, cols = param.full_shape
        if rows % 16 or cols % 16:
            raise ValueError(f"weight '{name}' is {rows} x {cols}: TE's FP8 GEMMs need both dimensions to be "
                             "multiples of 16; use the BF16 wire for it")
        return FP8_CURRENT
    raise ValueError(f"weight '{name}' travels on the {param.wire} wire, which cannot serve TE's "
                     f"{type(recipe).__name__} recipe: the FP8 wire serves Float8CurrentScaling; under "
                     f"{type(recipe).__name__} register the weight with wire='bf16' (TE then quantizes the "
                     "gathered BF16 weight itself)")


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
