"""Verdicts of the head-to-head (bench/megatron/head_to_head.py) and NCCL's own counts, pure: losses
as floats, parameters as CPU tensors with the global rows they hold, NCCL logs as text.

Verdict per variant and rank (and per step):
  "bit-identical"            libgtp's losses, grad norms and parameters equal Megatron's GTP's bit for bit
  "within Megatron's bound"  not identical, and libgtp's distance from GTP off is no larger than
                             Megatron's own (the bound, written beside it)
  "beyond Megatron's bound"  libgtp is farther from GTP off than Megatron's GTP is
  "refused by libgtp: MSG"   libgtp refused the configuration before training
  "failed: megatron (libgtp ran): MSG"  Megatron's own GTP raised; libgtp's distance from GTP off is
                             written beside it, with no bound to hold it to
  "failed: IMPL: MSG"        a run raised or timed out (the JSON has which run and its traceback)"""
import re

NCCL_OP = re.compile(r"NCCL INFO (\w+): opCount \w+ .*?count (\d+) datatype (\d+) .*?\[nranks=(\d+)\]")
DTYPE_BYTES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}  # ncclDataType_t
COUNT_FROM_STEP = 2  # NCCL operations are counted from this step on (the first ones set up, chains learnt)


def parse_nccl(text):
    """Every NCCL operation of NCCL_DEBUG_SUBSYS=COLL log text: (op, bytes, nranks)."""
    return [(m.group(1), int(m.group(2)) * DTYPE_BYTES.get(int(m.group(3)), 0), int(m.group(4)))
            for m in NCCL_OP.finditer(text)]


def op_table(per_step_ops, first=COUNT_FROM_STEP):
    """Operations and bytes per step by "Op[nranks=N]", averaged over the steps from `first` on."""
    steps = per_step_ops[first:]
    if not steps:
        return {}
    table = {}
    for ops in steps:
        for op, nbytes, nranks in ops:
            entry = table.setdefault(f"{op}[nranks={nranks}]", [0, 0])
            entry[0] += 1
            entry[1] += nbytes
    return {k: {"ops_per_step": n / len(steps), "bytes_per_step": b / len(steps)} for k, (n, b) in sorted(table.items())}


def gathers_per_weight(table, group_sizes, weights):
    """All-gathers over the GTP groups (nranks in group_sizes, each > 1) per step and per GTP weight."""
    sizes = {g for g in group_sizes if g > 1}
    ops = sum(v["ops_per_step"] for k, v in table.items()
              if k.startswith("AllGather[") and int(k.split("=")[1].rstrip("]")) in sizes)
    return {"allgathers_per_step": ops, "gtp_weights": weights,
            "allgathers_per_weight_per_step": ops / weights if weights else None}


def rel_distance(losses, reference):
    """Per step |a - b| / |b|."""
    if len(losses) != len(reference):
        raise ValueError(f"{len(losses)} losses against {len(reference)} reference losses: the runs stopped at "
                         "different steps")
    return [abs(a - b) / abs(b) if b else abs(a - b) for a, b in zip(losses, reference)]


def step_verdicts(lib, meg, off):
    """Per step: "bit-identical" (libgtp's loss equals Megatron's), else whether libgtp's distance from
    GTP off is within Megatron's (<=) or beyond it."""
    d_lib, d_meg = rel_distance(lib, off), rel_distance(meg, off)
    out = []
    for a, b, x, y in zip(lib, meg, d_lib, d_meg):
        if a.hex() == b.hex():
            out.append("bit-identical")
        else:
            out.append("within Megatron's bound" if x <= y else "beyond Megatron's bound")
    return out


def rows_diff(a_start, a, b_start, b):
    """max |a - b| over the global rows both hold (a holds rows a_start.., b holds b_start..), and the
    number of rows compared; (None, 0) when they share none or their columns differ."""
    lo, hi = max(a_start, b_start), min(a_start + a.shape[0], b_start + b.shape[0])
    if hi <= lo or tuple(a.shape[1:]) != tuple(b.shape[1:]):
        return None, 0
    x = a[lo - a_start:hi - a_start].float()
    y = b[lo - b_start:hi - b_start].float()
    return float((x - y).abs().max()) if x.numel() else 0.0, hi - lo


def param_distances(a, b):
    """Per parameter name, the largest difference over the rows both runs hold. a and b map a name to
    (first global row, tensor); names absent from either are skipped."""
    out = {}
    for name, (start, tensor) in a.items():
        if name in b:
            diff, rows = rows_diff(start, tensor, *b[name])
            if rows:
                out[name] = diff
    return out


def verdict(lib, meg, off):
    """One rank's verdict for a variant. Each argument: {"losses": [...], "grad_norms": [...],
    "params": {name: (row, tensor)}} or {"error": str, "refused": bool}. Losses may be empty (a pipeline
    stage without the loss): then the grad norms (global) and parameters decide."""
    if "error" in off:
        return {"verdict": f"failed: off: {off['error']}"}
    if "error" in lib:
        if lib.get("refused"):
            return {"verdict": f"refused by libgtp: {lib['error']}"}
        return {"verdict": f"failed: libgtp: {lib['error']}"}
    if "error" in meg:  # what Megatron's GTP does is recorded; libgtp's distance from GTP off stands alone
        out = {"verdict": f"failed: megatron (libgtp ran): {meg['error']}"}
        d = param_distances(lib["params"], off["params"])
        out["max_param_abs_diff_vs_off"] = {"libgtp": max(d.values(), default=None)}
        if lib["losses"]:
            out["max_rel_loss_vs_off"] = {"libgtp": max(rel_distance(lib["losses"], off["losses"]))}
        return out
    lib_meg = param_distances(lib["params"], meg["params"])
    lib_off = param_distances(lib["params"], off["params"])
    meg_off = param_distances(meg["params"], off["params"])
    identical = ([x.hex() for x in lib["losses"]] == [x.hex() for x in meg["losses"]]
                 and lib["grad_norms"] == meg["grad_norms"] and bool(lib_meg)
                 and all(d == 0.0 for d in lib_meg.values()) and len(lib_meg) == len(lib["params"]))
    out = {"params_compared": len(lib_meg), "max_param_abs_diff_libgtp_megatron": max(lib_meg.values(), default=None),
           "max_param_abs_diff_vs_off": {"libgtp": max(lib_off.values(), default=None),
                                         "megatron": max(meg_off.values(), default=None)},
           "losses_bit_identical": [x.hex() for x in lib["losses"]] == [x.hex() for x in meg["losses"]],
           "grad_norms_identical": lib["grad_norms"] == meg["grad_norms"]}
    norms = {"libgtp": max(rel_distance(lib["grad_norms"], off["grad_norms"]), default=0.0),
             "megatron": max(rel_distance(meg["grad_norms"], off["grad_norms"]), default=0.0)}
    out["max_rel_grad_norm_vs_off"] = norms
    if lib["losses"]:
        out["steps"] = step_verdicts(lib["losses"], meg["losses"], off["losses"])
        out["max_rel_loss_vs_off"] = {"libgtp": max(rel_distance(lib["losses"], off["losses"])),
                                      "megatron": max(rel_distance(meg["losses"], off["losses"]))}
        measured, bound = out["max_rel_loss_vs_off"]["libgtp"], out["max_rel_loss_vs_off"]["megatron"]
    else:  # no loss on this pipeline stage: the parameters it holds decide
        measured = out["max_param_abs_diff_vs_off"]["libgtp"] or 0.0
        bound = out["max_param_abs_diff_vs_off"]["megatron"] or 0.0
    if identical:
        out["verdict"] = "bit-identical"
    else:
        out["verdict"] = "within Megatron's bound" if measured <= bound else "beyond Megatron's bound"
        out["bound"] = {"measure": "max rel loss vs off" if lib["losses"] else "max param abs diff vs off",
                        "libgtp": measured, "megatron_bound": bound}
    return out


def overall(rank_verdicts):
    """A variant's verdict over its ranks: the worst one (failed / refused, beyond, within, identical)."""
    order = ("failed", "refused", "beyond", "within", "bit-identical")
    texts = [v["verdict"] for v in rank_verdicts]
    if not texts:
        return "failed: no rank reported"
    return min(texts, key=lambda t: next(i for i, k in enumerate(order) if t.startswith(k)))


def loaded_equal(runs):
    """After a checkpoint load, before training: whether every implementation holds the same values in
    the rows it shares with GTP off. runs: impl -> {name: (row, tensor)}."""
    off = runs["off"]
    out = {}
    for impl in ("megatron", "libgtp"):
        if impl in runs:
            d = param_distances(runs[impl], off)
            out[impl] = {"params": len(d), "equal_to_off": bool(d) and all(x == 0.0 for x in d.values()),
                         "max_abs_diff": max(d.values(), default=None)}
    return out
