"""The NVFP4 TE tensors libgtp hands TransformerEngine, byte for byte against TE 2.20.2's own reference
quantizer (transformer_engine/pytorch/custom_recipes/reference_nvfp4.py, NVFP4QuantizerRef: plain
PyTorch, run here on the CPU), on the host backend at G = 1, 2 and 4, so they are ready for a Blackwell
GEMM (docs/formats.md, "Checked against TransformerEngine").

What libgtp hands over is what gtp.torch runs in production: ShardedParameter.materialize_group_for_forward
under NVFP4BlockScaling (te_quantized.gemm_tensors, nvfp4_tensor, _refresh, weight_amax) over the
gathered GEMM layout that libgtp's CPU reference unpacked. Only TE's tensor classes, which need TE's CUDA
extension, are test doubles (_TETensorDouble): they keep what they are given under the attribute names of
TE's NVFP4TensorStorage, which are what TE's GEMM reads.

TE's reference comes from the pinned pure-Python wheel transformer-engine (tools/setup.sh unpacks it into
.te-reference in the checkout, never into site-packages: its package __init__ loads TE's CUDA library).
reference_nvfp4.py is loaded from that file without running those __init__s; its two imports that need
the compiled extension are test doubles: quantized_tensor (its base classes Quantizer, whose __init__
sets the two usage flags the reference reads, as TE's does, and QuantizedTensorStorage, an empty base)
and, for TE's custom_recipes/gemm.py (loaded for its GEMMType), tensor.utils.is_custom, which only the
reference's GEMM calls and raises here if anything does. TE's scale_inv shapes come from TE's own
NVFP4Quantizer / MXFP8Quantizer.get_scale_shape, compiled alone from the installed files.

MXFP8: TE 2.20.2 ships no CPU MXFP8 quantizer in its PyTorch package (MXFP8Quantizer runs CUDA only), so
MXFP8 codes and scales are checked against TE on a Blackwell GPU (tests/test_te.py); here only their
GEMM-swizzled layout is checked, with TE's own un-swizzle."""
import importlib.util
import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gtp.torch as gt  # noqa: E402
from gtp.torch import te_quantized as tq  # noqa: E402
from ranks import run_ranks, store_path  # noqa: E402
from test_te_recipes import _Recipe  # noqa: E402  (TE's recipe fields with TE's defaults)

TE_VERSION = "2.20.2"
TE_REFERENCE = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "..", ".te-reference")
_RECIPES = os.path.join(TE_REFERENCE, "transformer_engine", "pytorch", "custom_recipes")
BF16_MAX = 3.3895313892515355e38
GEMM_SCALES = ("row_major", "blocked_128x4")
SHAPES = [(64, 64), (144, 80), (48, 32)]  # at G = 4: 144 and 48 rows pad to 192 and 64, the last shard empty


def _te_installed_version():
    import glob
    infos = glob.glob(os.path.join(TE_REFERENCE, "transformer_engine-*.dist-info"))
    return os.path.basename(infos[0])[len("transformer_engine-"):-len(".dist-info")] if infos else None


if _te_installed_version() != TE_VERSION:
    pytest.skip(f"TransformerEngine {TE_VERSION}'s Python files are not at {os.path.normpath(TE_REFERENCE)} "
                f"(found {_te_installed_version()}): tools/setup.sh unpacks the pinned wheel there",
                allow_module_level=True)


class _QuantizerDouble:
    """Stands for TE's quantized_tensor.Quantizer (its module imports TE's CUDA extension): its __init__
    sets the usage flags as TE's does (rowwise_usage, columnwise_usage), the only base state the
    reference quantizer reads."""

    def __init__(self, *, rowwise, columnwise):
        self.rowwise_usage, self.columnwise_usage = rowwise, columnwise
        self.internal = self.optimize_for_gemm = False


class _QuantizedTensorStorageDouble:
    """Stands for TE's QuantizedTensorStorage: an empty base of the reference's result dataclass."""


def _is_custom_double(tensor):
    """Stands for TE's tensor.utils.is_custom, which only TE's reference GEMM calls: never called here."""
    raise AssertionError("TE's reference GEMM ran: this test only quantizes")


def _load_te_nvfp4_reference():
    """TE's reference_nvfp4 module, executed from the installed file with TE's package __init__s skipped
    (package modules with no search path, so nothing else of TE can load) and the three doubles above;
    sys.modules is left as it was, so no other test sees a transformer_engine module."""
    names = ("transformer_engine", "transformer_engine.pytorch", "transformer_engine.pytorch.custom_recipes",
             "transformer_engine.pytorch.quantized_tensor", "transformer_engine.pytorch.tensor.utils",
             "transformer_engine.pytorch.custom_recipes.reference_utils",
             "transformer_engine.pytorch.custom_recipes.gemm",
             "transformer_engine.pytorch.custom_recipes.reference_nvfp4")
    saved = {name: sys.modules.get(name) for name in names}
    try:
        for name in names[:3]:
            sys.modules[name] = types.ModuleType(name)
            sys.modules[name].__path__ = []
        sys.modules[names[3]] = types.ModuleType(names[3])
        sys.modules[names[3]].Quantizer = _QuantizerDouble
        sys.modules[names[3]].QuantizedTensorStorage = _QuantizedTensorStorageDouble
        sys.modules[names[4]] = types.ModuleType(names[4])
        sys.modules[names[4]].is_custom = _is_custom_double
        for name, file in ((names[5], "reference_utils.py"), (names[6], "gemm.py"), (names[7], "reference_nvfp4.py")):
            spec = importlib.util.spec_from_file_location(name, os.path.join(_RECIPES, file))
            module = sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        return module
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


REF = _load_te_nvfp4_reference()


def _te_functions():
    """TE's own get_scale_shape of NVFP4Quantizer and MXFP8Quantizer, compiled from the installed files
    (their modules import TE's CUDA extension, these methods nothing of it) with what they read: TE's
    round_up_to_nearest_multiple (pytorch/utils.py) and block sizes (pytorch/constants.py)."""
    import ast
    import math
    import typing
    root = os.path.join(TE_REFERENCE, "transformer_engine", "pytorch")

    def parse(path):
        with open(os.path.join(root, path)) as f:
            return ast.parse(f.read())
    namespace = {"math": math, "Iterable": typing.Iterable, "Tuple": typing.Tuple}
    for node in parse("constants.py").body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id.endswith("_BLOCK_SCALING_SIZE"):
            namespace[target.id] = ast.literal_eval(node.value)
    wanted = [("utils.py", None, "round_up_to_nearest_multiple"),
              ("tensor/nvfp4_tensor.py", "NVFP4Quantizer", "get_scale_shape"),
              ("tensor/mxfp8_tensor.py", "MXFP8Quantizer", "get_scale_shape")]
    found = {}
    for path, cls, name in wanted:
        scope = parse(path).body
        if cls is not None:
            scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls).body
        function = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
        local = {}
        exec(compile(ast.Module(body=[function], type_ignores=[]), path, "exec"), namespace, local)
        if cls is None:  # a module-level helper the methods call
            namespace.update(local)
        found[cls or name] = local[name]
    return SimpleNamespace(nvfp4_scale_shape=lambda shape, columnwise: found["NVFP4Quantizer"](None, shape, columnwise),
                           mxfp8_scale_shape=lambda shape, columnwise: found["MXFP8Quantizer"](None, shape, columnwise))


TE = _te_functions()


def te_quantize(weight, tile):
    """TE's reference quantization of a BF16 weight as NVFP4BlockScaling configures it: 16x16 tiles for
    weights (both usages), 1x16 otherwise (row-wise here: libgtp's 1D wire has no transpose), no RHT,
    no stochastic rounding (the reference has none), no 4over6, E4M3 scales (not powers of 2)."""
    two_d = tile == (16, 16)
    return REF.NVFP4QuantizerRef(dtype=REF.reference_utils.Fp4Formats.E2M1, rowwise=True, columnwise=two_d,
                                 quant_tile_shape=tile, pow_2_scales=False, with_rht=False).quantize(weight)


def unswizzle(scales, outer, inner, block):
    """TE's own un-swizzle of GEMM-ready scales (NVFP4QuantizerRef._recover_swizzled_scales, the 128x4
    layout TE's kernels write) over the whole padded matrix of an outer x inner tensor."""
    padded_outer = -(-outer // 128) * 128
    padded_inner = -(-(inner // block) // 4) * 4 * block
    return REF.NVFP4QuantizerRef._recover_swizzled_scales(True, scales, padded_outer, padded_inner, block)


def te_layout(compact, shape, columnwise):
    """`compact` (NVFP4 scales [outer, inner / 16]) zero-padded to TE's scale_inv shape for a tensor of
    `shape` (TE's NVFP4Quantizer.get_scale_shape)."""
    out = torch.zeros(TE.nvfp4_scale_shape(shape, columnwise), dtype=torch.uint8)
    out[:compact.shape[0], :compact.shape[1]] = compact
    return out


# ----- the weights (BF16, built once in the test process and sent to every rank)

def edge_weights(rows, cols):
    """name -> BF16 weight: random with 2^+-6 row bands, a zero tile, a tile 1e-4 below (E4M3-subnormal tile
    scales) and a peak; all zeros; values up to BF16's largest (saturating blocks); BF16 subnormals only
    (a global scale clamped to FLT_MAX); random with subnormals and a block on E2M1's rounding thresholds."""
    torch.manual_seed(rows * 1000 + cols)
    bands = torch.exp2(torch.randint(-6, 7, (rows, 1)).float())
    random = torch.randn(rows, cols) * bands
    random[:16, :16] = 0.0
    random[rows - 16:, cols - 16:] *= 1e-4
    random[rows // 2, 3] = 300.0
    huge = torch.randn(rows, cols) * 1e37
    huge[1, :5] = torch.tensor([BF16_MAX, -BF16_MAX, 3e38, -1e38, 2e38])
    subnormal = torch.randint(-127, 128, (rows, cols)).float() * 2.0 ** -133  # BF16 subnormals and zero
    mixed = torch.randn(rows, cols)
    mixed[::3, ::5] = 2.0 ** -130
    mixed[2, :16] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] * 2)  # block amax 6: scale 1
    weights = {"random": random, "zeros": torch.zeros(rows, cols), "huge": huge, "subnormal": subnormal,
               "mixed": mixed}
    return {name: w.to(torch.bfloat16) for name, w in weights.items()}


# ----- libgtp's side: what gtp.torch hands TE, on every rank

class _TETensorDouble:
    """Stands for TE's NVFP4Tensor and MXFP8Tensor (their modules need TE's CUDA extension): keeps each
    storage argument as TE's NVFP4TensorStorage / MXFP8TensorStorage do (`_rowwise_data`,
    `_rowwise_scale_inv`, ..., `_with_gemm_swizzled_scales`), where te_quantized._refresh writes and TE's
    GEMM reads."""

    def __init__(self, *, shape, dtype, quantizer, requires_grad, device, **storage):
        self.shape, self.quantizer = shape, quantizer
        for name, value in storage.items():
            setattr(self, "_" + name, value)


def _install_te_tensor_doubles(install=sys.modules.__setitem__):
    """_TETensorDouble and TE's dtype names in the modules te_quantized imports TE's tensor classes and dtypes from."""
    for kind in ("nvfp4", "mxfp8"):
        module = types.ModuleType(f"transformer_engine.pytorch.tensor.{kind}_tensor")
        setattr(module, f"{kind.upper()}Tensor", _TETensorDouble)
        setattr(module, f"{kind.upper()}Quantizer", lambda *args, **kwargs: SimpleNamespace(args=args, kwargs=kwargs))
        install(module.__name__, module)
    install("transformer_engine_torch", SimpleNamespace(DType=SimpleNamespace(kFloat4E2M1="kFloat4E2M1",
                                                                              kFloat8E4M3="kFloat8E4M3")))


TENSOR_FIELDS = ("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv",
                 "amax_rowwise", "amax_columnwise", "with_gemm_swizzled_scales")


def _hand_over(rank, world, store_dir, weights):
    """Per weight and GEMM scale order (row_major, blocked_128x4): the NVFP4Tensor gtp.torch hands TE for
    the 2D wire (forward, then backward), and the 1D wire's GEMM-layout row-wise codes, scales and amax
    (TE never gets the 1D wire as a tensor)."""
    _install_te_tensor_doubles()
    tq._active_recipe = lambda: _Recipe("nvfp4")  # TE's autocast, which refuses NVFP4 without sm_100
    ctx = gt.Context(torch.distributed.FileStore(store_path(store_dir), world), rank, world)
    out, params = {}, {}
    try:
        for key, weight in weights.items():
            rows, cols = weight.shape
            g = ctx.geometry(rows, cols, "nvfp4")
            mine = weight[g.row_start:g.row_start + g.valid_rows]
            for scales in GEMM_SCALES:
                params[key, scales] = [gt.ShardedParameter(mine, ctx, f"{key}_{two_d}_{scales}", rows, cols,
                                                           wire="nvfp4", nvfp4_2d=two_d, gemm_scales=scales)
                                       for two_d in (True, False)]
        ctx.shard_updated([p for pair in params.values() for p in pair])  # one amax reduction for all
        for (key, scales), (two_d, one_d) in params.items():
            rows, cols = two_d.full_shape
            got = {}
            for phase in ("forward", "backward"):
                tensor = getattr(two_d, f"materialize_group_for_{phase}")()
                assert isinstance(tensor, _TETensorDouble) and tensor.shape == (rows, cols)
                fields = {f: getattr(tensor, "_" + f) for f in TENSOR_FIELDS}
                got[phase] = {f: v.clone() if torch.is_tensor(v) else v for f, v in fields.items()}
                two_d.release_group("gemm")
            (view,) = one_d.materialize_group_views(layout="gemm")
            got["1d"] = {"data": view.data.tensor[:rows].clone(), "scales": view.scales.tensor.clone(),
                         "amax": tq.weight_amax(one_d).clone(), "scale_layout": view.scale_layout}
            one_d.release_group("gemm")
            out[key, scales] = got
        ctx.drain()
        return out
    finally:
        ctx.close()


def _assert_2d_equals_te(got, ref, rows, cols, blocked, where):
    assert got["with_gemm_swizzled_scales"] is blocked, where
    assert torch.equal(got["rowwise_data"], ref.data), f"{where}: row-wise E2M1 codes"
    assert torch.equal(got["columnwise_data"], ref.data_t), f"{where}: column-wise (transposed) codes"
    for name, ref_scale, columnwise in (("rowwise_scale_inv", ref.scale, False),
                                        ("columnwise_scale_inv", ref.scale_t, True)):
        want = te_layout(ref_scale.view(torch.uint8), (rows, cols), columnwise)
        outer, inner = (cols, rows) if columnwise else (rows, cols)
        ours = unswizzle(got[name], outer, inner, 16) if blocked else got[name]
        assert ours.dtype == torch.uint8 and torch.equal(ours, want), f"{where}: {name} (TE's layout, padding zero)"
    assert torch.equal(got["amax_rowwise"], ref.global_amax_row), f"{where}: amax"
    assert torch.equal(got["amax_columnwise"], ref.global_amax_col), f"{where}: column-wise amax"


@pytest.mark.parametrize("world", [1, 2, 4])
def test_nvfp4_tensors_equal_te_reference_quantizer_byte_for_byte(world):
    """Every field TE's NVFP4 GEMM reads, for every shape and edge weight, on every rank, in both GEMM scale
    orders: the 2D wire's NVFP4Tensor (row-wise codes, column-wise codes, both scale_inv in TE's padded
    layout, GEMM-swizzled with blocked_128x4, both amax; the forward's and the backward's) equals TE's
    16x16 reference; the 1D wire's row-wise codes, scales and amax equal TE's 1x16 reference."""
    weights = {(shape, name): w for shape in SHAPES for name, w in edge_weights(*shape).items()}
    keyed = {f"w{i}": w for i, w in enumerate(weights.values())}
    results = run_ranks(_hand_over, world, keyed)
    for i, ((shape, name), weight) in enumerate(weights.items()):
        rows, cols = shape
        ref_2d, ref_1d = te_quantize(weight, (16, 16)), te_quantize(weight, (1, 16))
        for rank, out in enumerate(results):
            for scales in GEMM_SCALES:
                got, blocked = out[f"w{i}", scales], scales == "blocked_128x4"
                where = f"{name} {rows}x{cols}, G = {world}, rank {rank}, {scales}"
                assert got["1d"]["scale_layout"] == scales, where
                for phase in ("forward", "backward"):
                    _assert_2d_equals_te(got[phase], ref_2d, rows, cols, blocked, f"{where}, 2D {phase}")
                one_d = got["1d"]
                assert torch.equal(one_d["data"], ref_1d.data), f"{where}: 1D codes"
                ours = one_d["scales"][:rows]  # the GEMM layout's compact [gemm_rows, cols / 16]
                if blocked:
                    full = unswizzle(one_d["scales"], rows, cols, 16)
                    ours = full[:rows, :cols // 16]
                    assert not full[rows:].any() and not full[:, cols // 16:].any(), f"{where}: 1D padding"
                assert torch.equal(ours, ref_1d.scale.view(torch.uint8)), f"{where}: 1D scales"
                assert torch.equal(one_d["amax"], ref_1d.global_amax_row), f"{where}: 1D amax"


@pytest.fixture
def handed_over(tmp_path, monkeypatch):
    """gtp.torch at G = 1 in this process; (weight, recipe kind, register args) -> what it hands TE."""
    _install_te_tensor_doubles(lambda name, module: monkeypatch.setitem(sys.modules, name, module))
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1) as ctx:
        def hand_over(weight, kind, **register):
            monkeypatch.setattr(tq, "_active_recipe", lambda: _Recipe(kind))
            rows, cols = weight.shape
            param = gt.ShardedParameter(weight, ctx, f"w{len(ctx.parameters)}", rows, cols, **register)
            ctx.shard_updated([param])
            tensor = param.materialize_group_for_forward()
            assert isinstance(tensor, _TETensorDouble)
            out = SimpleNamespace(**{k: v.clone() if torch.is_tensor(v) else v for k, v in vars(tensor).items()})
            param.release_group("gemm")
            return out
        yield hand_over
        ctx.drain()


def codes(data):
    """[r, c / 2] packed E2M1 bytes -> [r, c] codes, element 2k in the low nibble (TE's and libgtp's order)."""
    return torch.stack([data & 0xF, data >> 4], dim=-1).reshape(data.shape[0], -1)


def test_where_te_reference_differs_non_finite_and_negative_zero(handed_over):
    """The two places libgtp's NVFP4 differs from TE's reference, each exactly as docs/formats.md says:
    - a weight holding Inf or NaN: TE's reference takes its global amax over every element (torch.max:
      NaN or Inf, every tile scale then meaningless); libgtp's amax is the largest finite |x|, the 16x16
      tiles holding the Inf / NaN get scale 0x7F (E4M3 NaN) and codes 0, and every other tile equals TE's
      reference on the same weight with those elements zeroed;
    - an input of exactly -0.0: TE's Python reference (cast_to_fp4x2) gives code 0x0, libgtp keeps the
      sign (0x8; libgtp's CUDA kernel is bit-identical to its reference). Both decode to zero."""
    rows, cols = 64, 64
    torch.manual_seed(3)
    weight = torch.randn(rows, cols).to(torch.bfloat16)
    weight[0:3, 20] = -0.0                      # in a finite tile (1 = column tile 1)
    weight[48:64, 0:16] = -0.0                  # a whole tile of -0.0
    weight[5, 40], weight[20, 7], weight[33, 60] = float("inf"), float("nan"), float("-inf")
    bad_tiles = {(0, 2), (1, 0), (2, 3)}        # (row tile, column tile) holding Inf / NaN
    ours = handed_over(weight, "nvfp4", wire="nvfp4", nvfp4_2d=True)
    te = te_quantize(weight, (16, 16))
    assert te.global_amax_row.isnan().all(), "TE's reference amax is NaN for a weight holding a NaN"
    only_inf = weight.nan_to_num(nan=0.0, posinf=float("inf"), neginf=float("-inf"))
    assert te_quantize(only_inf, (16, 16)).global_amax_row.isinf().all(), "and Inf for one holding an Inf"
    clean = weight.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    te_clean = te_quantize(clean, (16, 16))
    assert torch.equal(ours._amax_rowwise, te_clean.global_amax_row) and torch.equal(ours._amax_columnwise,
                                                                                        te_clean.global_amax_col)
    assert ours._amax_rowwise.item() == clean.float().abs().max().item() > 0
    for usage, data, scale, te_data, te_scale, source in (
            ("row-wise", ours._rowwise_data, ours._rowwise_scale_inv, te_clean.data, te_clean.scale, weight),
            ("column-wise", ours._columnwise_data, ours._columnwise_scale_inv, te_clean.data_t, te_clean.scale_t,
             weight.t())):
        bad = torch.zeros(4, 4, dtype=torch.bool)
        for r, c in bad_tiles:
            bad[(r, c) if usage == "row-wise" else (c, r)] = True
        bad_elements = bad.repeat_interleave(16, 0).repeat_interleave(16, 1)
        got_codes, te_codes = codes(data), codes(te_data)
        assert not got_codes[bad_elements].any(), f"{usage}: codes 0 in the tiles holding Inf / NaN"
        bad_scales = bad.repeat_interleave(16, 0)  # TE's layout: each tile's scale on its 16 rows
        got_scale = scale[:64, :4]
        assert (got_scale[bad_scales] == 0x7F).all(), f"{usage}: scale 0x7F (E4M3 NaN) for those tiles"
        assert torch.equal(got_scale[~bad_scales], te_scale.view(torch.uint8)[~bad_scales]), usage
        negative_zero = (source == 0) & source.float().signbit() & ~bad_elements
        assert negative_zero.sum() == 16 * 16 + 3
        assert (got_codes[negative_zero] == 0x8).all() and (te_codes[negative_zero] == 0x0).all(), usage
        same = ~bad_elements & ~negative_zero
        assert torch.equal(got_codes[same], te_codes[same]), f"{usage}: every other code is TE's"


def test_mxfp8_blocked_scales_are_te_swizzle_of_the_handed_over_scales(handed_over):
    """The MXFP8 wire's MXFP8Tensor, row-major (TE's padded layout) and blocked_128x4 (GEMM-swizzled): the
    same codes, and TE's own un-swizzle of the blocked scales (NVFP4QuantizerRef._recover_swizzled_scales,
    its reader of the 128x4 layout, with 32-element blocks) gives the row-major ones, padding included.
    (Codes and scale values against TE's MXFP8Quantizer: on a Blackwell GPU, tests/test_te.py.)"""
    for rows, cols in ((96, 160), (256, 64)):
        torch.manual_seed(rows)
        weight = (torch.randn(rows, cols) * torch.exp2(torch.randint(-8, 9, (rows, 1)).float())).to(torch.bfloat16)
        plain = handed_over(weight, "mxfp8", wire="mxfp8")
        blocked = handed_over(weight, "mxfp8", wire="mxfp8", gemm_scales="blocked_128x4")
        assert not plain._with_gemm_swizzled_scales and blocked._with_gemm_swizzled_scales
        assert plain._columnwise_data is None and blocked._columnwise_data is None, "row-wise usage only"
        assert torch.equal(plain._rowwise_data, blocked._rowwise_data) and plain._rowwise_data.shape == (rows, cols)
        assert tuple(plain._rowwise_scale_inv.shape) == TE.mxfp8_scale_shape((rows, cols), False)
        assert plain._rowwise_scale_inv[:rows, :cols // 32].any(), "scales written"
        assert torch.equal(unswizzle(blocked._rowwise_scale_inv, rows, cols, 32), plain._rowwise_scale_inv)


def test_scale_shapes_are_te_get_scale_shape():
    """te_quantized's NVFP4 / MXFP8 scale_inv shapes (what it allocates and checks blocked scales against)
    equal TE's own NVFP4Quantizer / MXFP8Quantizer.get_scale_shape, padded shapes included."""
    for rows, cols in ((64, 64), (144, 80), (48, 32), (96, 160), (512, 256), (4096, 1024)):
        for columnwise in (False, True):
            assert tq.nvfp4_scale_shape(rows, cols, columnwise) == TE.nvfp4_scale_shape((rows, cols), columnwise)
        if rows % 32 == 0 and cols % 32 == 0:
            assert tq.mxfp8_scale_shape(rows, cols) == TE.mxfp8_scale_shape((rows, cols), False)
    assert TE.nvfp4_scale_shape((144, 80), False) == (256, 8) and TE.nvfp4_scale_shape((144, 80), True) == (128, 12)
