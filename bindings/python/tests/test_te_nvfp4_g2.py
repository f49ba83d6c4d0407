"""The NVFP4 2D wire as TE's NVFP4Tensor at G = 2: two processes, one GPU each, the CUDA backend over a
real two-rank NCCL communicator. On both ranks the tensor gathered from the two shards (the peak in
rank 0's rows, then, after an update, in rank 1's) equals TE's reference quantizer on the whole weight
byte for byte, its amax included: the group-reduced amax libgtp packed with (gtp_weight_amax), not the
rank's own. Skips without two GPUs or without TE (the host-backend version of this check, in CI:
tests/test_te_recipes.py)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gtp.torch as gt  # noqa: E402
from ranks import run_ranks, store_path  # noqa: E402

if torch.cuda.device_count() < 2:
    pytest.skip(f"{torch.cuda.device_count()} CUDA device(s): NVFP4 at G = 2 needs two GPUs", allow_module_level=True)
te = pytest.importorskip("transformer_engine.pytorch", reason="TransformerEngine is not installed "
                         "(pip install transformer_engine[pytorch]; the GPU machine's copy: ../shared/te-h200)")


def _weight(rows, cols, step, device):
    """A BF16 weight with a zero tile, a tiny value and a tile far below the amax; its peak in the first
    shard's rows at step 0, in the last rows (the second shard's) at step 1."""
    torch.manual_seed(5 + step)
    weight = torch.randn(rows, cols, device=device).to(torch.bfloat16)
    weight[:16, :16] = 0.0
    weight[20, 3] = 1e-30
    weight[rows - 32:rows - 16, :16] *= 1e-4
    if step == 0:
        weight[5, cols - 1] = 300.0
    else:
        weight[rows - 3, 2] = -500.0
    return weight


def _rank(rank, world, store_dir, rows, cols):
    from transformer_engine.common import recipe as te_recipe
    from gtp.torch import te_quantized
    torch.cuda.set_device(rank)
    device = torch.device(f"cuda:{rank}")
    te_quantized._active_recipe = te_recipe.NVFP4BlockScaling  # TE's autocast refuses NVFP4 below sm_100
    ctx = gt.Context(torch.distributed.FileStore(store_path(store_dir), world), rank, world, backend="cuda",
                     device=device, timeout_s=120)
    try:
        geometry = ctx.geometry(rows, cols, "nvfp4")
        mine = slice(geometry.row_start, geometry.row_start + geometry.valid_rows)
        param = gt.ShardedParameter(_weight(rows, cols, 0, device)[mine], ctx, "w", rows, cols, wire="nvfp4",
                                    nvfp4_2d=True)
        out = []
        for step in range(2):
            if step:
                with torch.no_grad():
                    param.copy_(_weight(rows, cols, step, device)[mine])
            ctx.shard_updated([param])
            ours = param.materialize_group_for_forward()
            got = {name: getattr(ours, name).cpu() for name in
                   ("_rowwise_data", "_columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv",
                    "_amax_rowwise", "_amax_columnwise")}
            got["type"] = type(ours).__name__
            got["local_amax"] = param.detach().abs().float().amax().item()
            out.append(got)
            ctx.drain()
        return out
    finally:
        ctx.close()


@pytest.mark.parametrize("shape", [(512, 256), (144, 80)], ids=["512x256", "144x80_padded"])
def test_nvfp4_2d_wire_at_g_2_is_te_quantization_of_the_whole_weight(shape):
    from transformer_engine.pytorch.custom_recipes import reference_utils
    from transformer_engine.pytorch.custom_recipes.reference_nvfp4 import NVFP4QuantizerRef
    rows, cols = shape
    results = run_ranks(_rank, 2, rows, cols)
    for step, peak in enumerate((300.0, 500.0)):
        ref = NVFP4QuantizerRef(dtype=reference_utils.Fp4Formats.E2M1, rowwise=True, columnwise=True,
                                quant_tile_shape=(16, 16), pow_2_scales=False,
                                with_rht=False).quantize(_weight(rows, cols, step, "cuda:0"))
        locals_ = [out[step]["local_amax"] for out in results]
        assert max(locals_) == peak and min(locals_) < peak, f"step {step}: one rank holds the peak ({locals_})"
        for rank, out in enumerate(results):
            got, where = out[step], f"step {step}, rank {rank}"
            assert got["type"] == "NVFP4Tensor", where
            assert torch.equal(got["_amax_rowwise"], ref.global_amax_row.cpu()), f"{where}: amax"
            assert torch.equal(got["_amax_columnwise"], ref.global_amax_col.cpu()), f"{where}: column-wise amax"
            assert torch.equal(got["_rowwise_data"], ref.data.cpu()), f"{where}: row-wise codes"
            assert torch.equal(got["_columnwise_data"], ref.data_t.cpu()), f"{where}: column-wise codes"
            assert torch.equal(got["_rowwise_scale_inv"][:rows, :cols // 16], ref.scale.view(torch.uint8).cpu()), where
            assert torch.equal(got["_columnwise_scale_inv"][:cols, :rows // 16],
                               ref.scale_t.view(torch.uint8).cpu()), where
