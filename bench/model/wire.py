"""What one weight gather puts on the wire, per rank, in libgtp and in Megatron-Core's GTP, and how many
NCCL operations it takes. Exact byte counts: libgtp's chunk layout is docs/formats.md ("Wire chunk");
Megatron's is TE's gather of data and scale_inv as separate tensors (gtp-anatomy.md 5.2-5.3)."""

FORMATS = ("bf16", "fp8", "mxfp8", "nvfp4")
ROW_ALIGN = {"bf16": 16, "fp8": 16, "mxfp8": 32, "nvfp4": 16}   # docs/formats.md, Vocabulary
COL_MULTIPLE = {"bf16": 16, "fp8": 16, "mxfp8": 32, "nvfp4": 16}
FILL_TAG_BYTES = 64                                               # docs/formats.md, Fill tag
SECTION_ALIGN = 256


def round_up(x, m):
    return (x + m - 1) // m * m


def check_format(fmt):
    if fmt not in FORMATS:
        raise ValueError(f"unknown wire format {fmt!r}: use one of {', '.join(FORMATS)}")


def check_group(g, what="G"):
    if not isinstance(g, int) or isinstance(g, bool) or g < 1:
        raise ValueError(f"{what} = {g!r} is not a positive integer group size: use 1, 2, 4, 8, 16, 64, ...")


def shard_rows(rows, cols, g, fmt):
    """Rows each rank holds: rows padded to a multiple of (row alignment x G), split over G."""
    check_format(fmt)
    check_group(g)
    if rows < 1:
        raise ValueError(f"rows = {rows} must be positive")
    if cols < 1 or cols % COL_MULTIPLE[fmt]:
        raise ValueError(f"cols = {cols} must be a positive multiple of {COL_MULTIPLE[fmt]} for the {fmt} wire "
                         f"(docs/formats.md); pad the weight's in_features")
    return round_up(rows, ROW_ALIGN[fmt] * g) // g


def libgtp_chunk_bytes(rows, cols, g, fmt, nvfp4_2d=True):
    """Bytes of one rank's wire chunk (data, scales, scalars, each section 256-byte aligned). NVFP4 takes
    16x16 blocks by default (libgtp's weight layout), 1x16 with nvfp4_2d=False; MXFP8 1x32 blocks."""
    r = shard_rows(rows, cols, g, fmt)
    nvfp4_scales = (r // 16) * (cols // 16) if nvfp4_2d else r * cols // 16
    data = {"bf16": 2 * r * cols, "fp8": r * cols, "mxfp8": r * cols, "nvfp4": r * cols // 2}[fmt]
    scales = {"bf16": 0, "fp8": 0, "mxfp8": r * cols // 32, "nvfp4": nvfp4_scales}[fmt]
    scalars = 16 if fmt in ("fp8", "nvfp4") else 0
    if fmt == "bf16":
        return data  # the BF16 shard is gathered in place, as it is (docs/formats.md, Fill tag)
    scales_off = round_up(data, SECTION_ALIGN)
    scalars_off = round_up(scales_off + scales, SECTION_ALIGN)
    return round_up(scalars_off + scalars, SECTION_ALIGN)


def megatron_op_bytes(rows, cols, g, fmt, direction, both_usages=False):
    """Bytes each rank sends per all_gather_into_tensor call of one Megatron GTP gather, one entry per call
    (scale_inv first, then data, as TE's _all_gather_mxfp8 / _all_gather_nvfp4 issue them). Scale shapes
    after TE strips their dim-0 padding: MXFP8 rowwise [R, round_up(K/32, 4)], columnwise
    [R/32, round_up(K, 128)]; NVFP4 rowwise [R, round_up(K/16, 4)], columnwise data [K, R/2] and scales
    [K, round_up(R/16, 4)]. FP8 per-tensor: data only (TE's _all_gather_fp8; not a documented GTP mode)."""
    if direction not in ("fwd", "bwd"):
        raise ValueError(f"direction = {direction!r}: use 'fwd' (rowwise) or 'bwd' (columnwise)")
    r = shard_rows(rows, cols, g, fmt)
    k = cols
    if fmt == "bf16":
        return [2 * r * k]
    if fmt == "fp8":
        return [r * k]
    if both_usages:
        return (megatron_op_bytes(rows, cols, g, fmt, "fwd") + megatron_op_bytes(rows, cols, g, fmt, "bwd"))
    if fmt == "mxfp8":
        scale = r * round_up(k // 32, 4) if direction == "fwd" else (r // 32) * round_up(k, 128)
        return [scale, r * k]
    # nvfp4
    if direction == "fwd":
        return [r * round_up(-(-k // 16), 4), r * k // 2]
    return [k * round_up(-(-r // 16), 4), k * r // 2]


def gather_counts(system, rows, cols, g, fmt, direction, count=1, fill_tag=True, both_usages=False):
    """(NCCL ops, bytes each rank sends) for one materialization of a weight role of `count` same-shape
    weights (count > 1: the experts of one MoE block, gathered in one NCCL group by both systems)."""
    if g == 1:
        return 0, 0
    if system == "libgtp":
        ops = count + (1 if fill_tag else 0)   # one chunk per weight, plus the fill's 64-byte tag
        return ops, count * libgtp_chunk_bytes(rows, cols, g, fmt) + (FILL_TAG_BYTES if fill_tag else 0)
    if system == "megatron":
        per = megatron_op_bytes(rows, cols, g, fmt, direction, both_usages)
        return count * len(per), count * sum(per)
    raise ValueError(f"system = {system!r}: use 'libgtp' or 'megatron'")
