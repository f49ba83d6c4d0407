#!/usr/bin/env bash
# On the GPU machine (one H200, torch 2.11, Python 3.12, no network): Megatron-Core 0.19.2 trains
# GPTModel (TE layer spec, 4 layers) and a small MoE (TEGroupedLinear experts) through its DDP,
# distributed optimizer and finalize_model_grads, with libgtp at G = 1 (gtp.megatron) against the same
# run without GTP, plus FP8, activation recompute and a torch_dist checkpoint round trip. Needs
# .carry/ from bench/megatron/stage_megatron.sh. Each part runs in its own process under its own time
# limit, so one failure hides nothing else; logs and one JSON per part (megatron_<part>.json) go to
# $OUT, and megatron_bench.json gathers them. GTP_MEGATRON_PARTS picks parts (default: all);
# GTP_COMMIT names the commit in the JSON. About 4-6 minutes.
set -uo pipefail
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
parts=${GTP_MEGATRON_PARTS:-gpt moe ckpt fp8 recompute}
source bench/gpu_env.sh
python3 - <<'PY' || { echo "run_megatron: unpacking .carry failed (run bench/megatron/stage_megatron.sh here first)"; exit 1; }
import glob, tarfile, zipfile
tarfile.open(glob.glob('.carry/te/te_bundle_*.tar.xz')[0]).extractall('/tmp/te', filter='data')
zipfile.ZipFile(glob.glob('.carry/megatron/megatron_core-*.whl')[0]).extractall('/tmp/mcore')
try:
    import psutil  # noqa: F401  (Megatron-Core's torch_dist writer needs it)
except ImportError:
    zipfile.ZipFile(glob.glob('.carry/megatron/psutil-*.whl')[0]).extractall('/tmp/mcore')
PY
export PYTHONPATH=/tmp/te/site:/tmp/te/deps:/tmp/mcore:$PWD/bindings/python
export GTP_LIBRARY=$PWD/.carry/bin/libgtp.so
nvidia-smi -L
python3 -c "import torch, transformer_engine as te, transformer_engine.pytorch, megatron.core; print('torch', torch.__version__, 'TE', te.__version__, 'megatron-core ok')"
status=0
declare -A limits=([gpt]=90 [moe]=90 [ckpt]=75 [fp8]=60 [recompute]=60)
for part in $parts; do
  echo "== $part (limit ${limits[$part]:-90} s)"
  start=$(date +%s)
  timeout "${limits[$part]:-90}" python3 bench/megatron/megatron_bench.py --part "$part" \
    --json "$out/megatron_$part.json" --commit "${GTP_COMMIT:-unknown}" > "$out/megatron_$part.log" 2>&1
  rc=$?
  echo "$part: exit $rc after $(( $(date +%s) - start )) s$([ $rc = 124 ] && echo ' (TIMED OUT)')"
  [ $rc = 0 ] || status=1
  grep -E '"ok"|bit_identical|max_rel|within_bound|identical_continuation|time_ratio|peak_ratio|"error"|ms/step' \
    "$out/megatron_$part.log" | head -n 40
  [ $rc = 0 ] || tail -n 25 "$out/megatron_$part.log"
done
python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
parts = {}
for path in sorted(glob.glob(os.path.join(out, "megatron_*.json"))):
    if path.endswith("megatron_bench.json"):
        continue
    try:
        with open(path) as f:
            data = json.load(f)
        parts[data.get("part", path)] = data
    except Exception as error:  # a part killed while writing
        parts[os.path.basename(path)] = {"ok": False, "error": f"unreadable: {error}"}
with open(os.path.join(out, "megatron_bench.json"), "w") as f:
    json.dump({"benchmark": "megatron_bench", "parts": parts}, f, indent=1)
print("megatron_bench.json:", {k: v.get("ok") for k, v in parts.items()})
PY
exit $status
