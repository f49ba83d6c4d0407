# The GPU runner's steps (tools/gpu/run.sh sources this file): the one place that says what each
# named step runs. Each row of STEP_TABLE is a step: its name, its time limit in seconds, what it
# needs unpacked beyond the binaries (te: the TransformerEngine bundle, mcore: TE and Megatron-Core,
# -: nothing) and what it does; step_NAME is its command. Inside a step:
#   BIN, LIB    the staged binaries and host libraries;  OUT_DIR (= OUT)  the step's own folder
#   RUN_DIR     this call's folder (every step's folder is in it);  GTP_COMMIT  the staged commit
#   part NAME LIMIT COMMAND...   runs COMMAND, its output in $OUT_DIR/NAME.log, under LIMIT seconds
#                                (- = the step's time left); prints one verdict line
# A step fails when one of its parts fails (or it exits non-zero); exit 2 refuses (wrong machine).

# name            limit needs what
STEP_TABLE='
tests             420   -     every one-GPU gtest (GTP_TESTS: some): kernels, remat runtime, C ABI, comm (NCCL size-1 groups), failures, fill tags, watchdog
sanitizers        540   -     compute-sanitizer: memcheck and racecheck on the kernels, memcheck on the runtime and C ABI tests, racecheck and synccheck on cuda_graph_test
kernel_bench      120   -     gtp-kernel-bench: pack and unpack of every wire against a device copy (kernel_bench.json)
torch_peer        180   -     bench/peers/torch_quant_peer.py: torch.compile quantization, the kernel benchmark peer (torch_peer.json)
overlap           300   -     gtp-overlap-bench on one GPU: 1 and 4 microbatches, re-packed, keep_gathered off and on, grads into main grad off
remat             300   -     remat host overhead per weight: cuda_overhead_bench and c_abi_overhead_bench (remat_overhead_*gpu.json)
remat_capi_cuda   240   -     c_abi_overhead_bench on GTP_BACKEND_CUDA only, 3 repetitions (remat_overhead_capi_gpu_diverge.json)
fill_tag_bench    120   -     fill_tag_cuda_bench: host time of a fill with and without the fill-tag check (one JSON line)
comm              300   -     gtp-bench all-gather / reduce-scatter and every wire (one rank per GPU), wires checked against the CPU reference, live cluster setup
topology          60    -     gtp-topo probe of the live machine (topology.json)
profile           300   -     Nsight Compute on the wire kernels at GTP_PROFILE_MIB (default 64) MiB, and their SASS
python            300   -     gtp.torch CUDA tests (pytest) and train_gpt.py on one GPU, GTP off and on (the machinery at G = 1; train_gpt_cuda.json)
te_tests          360   te    TransformerEngine on libgtp: pytest test_te.py, test_te_protocol.py, test_te_nvfp4_g2.py
te_memcheck       420   te    compute-sanitizer memcheck over one TE case per layer (BF16 and the FP8 wire)
te_stack          300   te    bench/te/te_stack_bench.py: 8 x te.Linear(8192, 8192), G = 1: off, off control, inert, machinery (te_stack_bench.json); GTP_TE_BENCH_ARGS
g1_machinery      330   mcore issue 41 parts 1, 2 at G = 1: te_stack_bench.py (off, control, off_ctx, inert, libgtp machinery, Megatron-Core GTP forced to its machinery; BF16, FP8; B = 4, keep on; g1_machinery.json, GTP_G1_ARGS) and g1_machinery_gpt.py (GPTModel, libgtp and megatron each against its GTP-off pair; g1_gpt_*.json)
te_nvfp4          420   te    NVFP4: test_te.py -k nvfp4 (G = 1) and test_te_nvfp4_g2.py (G = 2, two GPUs)
megatron          420   mcore Megatron-Core on libgtp at G = 1: parts GTP_MEGATRON_PARTS (default gpt moe ckpt fp8 recompute), megatron_bench.json
peers             540   mcore G ranks on one GPU as real NCCL peers: runtime, failures, TE layers, GPT example, memcheck, head to head (GTP_PEERS_STEPS=REGEX picks parts)
bridge            420   mcore Megatron Bridge 0.6.2 pretrain on libgtp: G = 1 off / machinery / inert, save + resume, MoE, G = 2 real peers (bridge_gpu.json)
h2h               540   mcore bench/megatron/head_to_head.py: libgtp against Megatron-Core GTP on real peers (GTP_H2H_ARGS, runs separated by semicolons)
mlm               360   mcore bench/megatron/pretrain_gpu.py: Megatron-LM pretrain, libgtp (gtp.megatron.training.enable) against Megatron-Core GTP, G = 1 and 2 on real peers, save at 10, resume to 20 (pretrain_gpu.json; GTP_MLM_ARGS)
rig               480   -     the one-GPU rig at G = 2, 4, 8 (a test double for NCCL): probe, its collectives, divergence, sanitizers; GTP_RIG_STEPS=REGEX picks parts
rig_stage         300   -     one_gpu_rig_test in fresh processes, copy-engine against kernel staging (rig_stage.json)
mg_collectives    420   -     2+ GPUs: gtp-bench all-gather BF16 and every wire, reduce-scatter FP32, one rank per GPU
mg_peer           150   -     2+ GPUs: the FSDP2 all-gather peer
mg_overlap        150   -     2+ GPUs: gtp-overlap-bench with G = N under gtp-launch
mg_train          200   -     2+ GPUs: train_gpt.py at G = N, re-sharded to N/2
mg_pairs          420   -     2+ GPUs: the two-rank cases of the GPU tests (one process, two GPUs) and fill_tag_cuda_bench G = 2
mg_extras         540   -     2+ GPUs: fill graphs, 4 microbatches, groups of N/2, every wire checked against the CPU reference
mg_summary        60    -     bench/multi_gpu_summary.py over what the mg_ steps wrote in this call
'
# name      the steps it stands for, in order
ALIAS_TABLE='
check       tests sanitizers
final       tests kernel_bench overlap sanitizers python torch_peer remat comm topology
te          te_tests te_memcheck te_stack
multi_gpu   mg_collectives mg_peer mg_overlap mg_train mg_pairs mg_extras mg_summary
'

# The single-GPU gtests; every one of them skips its two-rank cases on one GPU (mg_pairs runs those).
ONE_GPU_TESTS='cuda_kernels_test cuda_backend_test cuda_stream_capture_test cuda_fill_graphs_test cuda_graph_test
gtp_cuda_test gtp_cuda_graph_test gtp_fp8_gemm_test gtp_shared_use_test nccl_test streams_test cuda_failure_test
cuda_fill_tags_test gtp_cuda_watchdog_test'

step_tests() {  # GTP_TESTS="a b": only those of ONE_GPU_TESTS
  for t in ${GTP_TESTS:-$ONE_GPU_TESTS}; do part "$t" 180 "$BIN/$t" --gtest_brief=1; done
}

step_sanitizers() {
  part kernels_memcheck 240 env GTP_KERNEL_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BIN/cuda_kernels_test" --gtest_brief=1
  part kernels_racecheck 120 env GTP_KERNEL_TEST_QUICK=1 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$BIN/cuda_kernels_test" --gtest_brief=1 --gtest_filter='CudaKernels.PackAndUnpack*'
  # These tests run NCCL, whose init probes its kernels with cudaFuncGetAttributes and gets
  # cudaErrorNoKernelImageForDevice for architectures its build lacks (12-16 such API errors, all
  # inside libnccl, in the 2026-12-02 run); memcheck counts them as errors. API error reporting is
  # off so the exit code reflects memory errors in our kernels and the runtime.
  for t in cuda_backend_test cuda_stream_capture_test cuda_fill_graphs_test cuda_graph_test gtp_cuda_test \
           gtp_cuda_graph_test gtp_fp8_gemm_test gtp_shared_use_test cuda_failure_test; do
    part "${t}_memcheck" 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
      "$BIN/$t" --gtest_brief=1
  done
  # Not the held-stream case: it holds the GPU with a host function that waits for a flag the host
  # raises after enqueueing, which compute-sanitizer's serialized launches never reach (30 s timeout).
  part cuda_fill_tags_memcheck 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    "$BIN/cuda_fill_tags_test" --gtest_brief=1 --gtest_filter='-*NoSlotIsReusedBeforeItsCopyRan*'
  for tool in racecheck synccheck; do
    part "cuda_graph_test_$tool" 120 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/cuda_graph_test" --gtest_brief=1
  done
}

step_kernel_bench() {
  part gtp-kernel-bench - "$BIN/gtp-kernel-bench" --json "$OUT_DIR/kernel_bench.json"
  grep -E "^(fp8|mxfp8|nvfp4_1d|nvfp4_2d|bf16|-) .* (64|256) " "$OUT_DIR/gtp-kernel-bench.log"
}

step_torch_peer() {
  part torch_quant_peer - python3 bench/peers/torch_quant_peer.py --json "$OUT_DIR/torch_peer.json"
  grep -v Warning "$OUT_DIR/torch_quant_peer.log" | tail -n 30
}

step_overlap() {  # one GPU: the gather is a size-1 communicator's device copy
  part overlap_mb1 120 "$BIN/gtp-overlap-bench" --json "$OUT_DIR/overlap_bench.json"
  # 4 microbatches a step: wgrads accumulated, one reduce-scatter per weight per step.
  part overlap_mb4 90 "$BIN/gtp-overlap-bench" --microbatches 4 --wires bf16,nvfp4 --json "$OUT_DIR/overlap_bench_mb4.json"
  for keep in off on; do  # weights re-packed every step
    part "overlap_mb4_repack_keep_$keep" 90 "$BIN/gtp-overlap-bench" --microbatches 4 --wires bf16,nvfp4 --depths 2 \
      --priorities high --repack on --keep-gathered $keep --json "$OUT_DIR/overlap_bench_mb4_repack_keep_$keep.json"
  done
  # keep_gathered, the wgrads through the size-1 communicator's reduce-scatter and the deferred add
  # instead of straight into the main grads (what the runs above do by default at G = 1).
  part overlap_mb4_repack_keep_on_buffers 90 "$BIN/gtp-overlap-bench" --microbatches 4 --wires bf16,nvfp4 --depths 2 \
    --priorities high --repack on --keep-gathered on --grads-into-main-grad off \
    --json "$OUT_DIR/overlap_bench_mb4_repack_keep_on_buffers.json"
  grep -hE "^(resident|gtp|sizes|rates|auto-size|one rank)" "$OUT_DIR"/overlap_*.log | head -60
}

step_remat() {
  part cuda_overhead_bench 150 "$BIN/cuda_overhead_bench" --benchmark_min_time=0.1 \
    --benchmark_out="$OUT_DIR/remat_overhead_gpu.json" --benchmark_out_format=json \
    --benchmark_context=commit="$GTP_COMMIT"
  # The host backend, then GTP_BACKEND_CUDA, through the C ABI.
  part c_abi_overhead_bench 150 "$BIN/c_abi_overhead_bench" --benchmark_min_time=0.1 \
    --benchmark_out="$OUT_DIR/remat_overhead_capi_gpu.json" --benchmark_out_format=json \
    --benchmark_context=commit="$GTP_COMMIT"
  grep -E "^BM_C" "$OUT_DIR/c_abi_overhead_bench.log" | head -80
}

step_remat_capi_cuda() {  # size-1 group, where the runtime skips the fill-tag check: comparable to perf-history's v6
  part c_abi_overhead_bench_cuda - "$BIN/c_abi_overhead_bench" --benchmark_filter='backend:1' --benchmark_min_time=0.1 \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_out="$OUT_DIR/remat_overhead_capi_gpu_diverge.json" --benchmark_out_format=json \
    --benchmark_context=commit="$GTP_COMMIT"
  # name and us_per_weight of each median row
  awk '/_median/ { for (i = 1; i <= NF; i++) if ($i ~ /^us_per_weight=/) print $1, $i }' \
    "$OUT_DIR/c_abi_overhead_bench_cuda.log" | head -40
}

step_fill_tag_bench() {
  part fill_tag_cuda_bench - "$BIN/fill_tag_cuda_bench"
  grep -E '^\{' "$OUT_DIR/fill_tag_cuda_bench.log"
}

step_comm() {  # one rank per visible GPU
  local gpus format
  gpus=$(nvidia-smi -L | grep -c '^GPU')
  part comm_all_gather_bf16 120 "$BIN/gtp-launch" -n "$gpus" --timeout 540 -- "$BIN/gtp-bench" all_gather \
    -b 1M -e 1G -f 4 -n 20 -w 5 -d bfloat16 --json "$OUT_DIR/comm_all_gather_bf16.json"
  part comm_reduce_scatter_fp32 120 "$BIN/gtp-launch" -n "$gpus" --timeout 540 -- "$BIN/gtp-bench" reduce_scatter \
    -b 1M -e 1G -f 4 -n 20 -w 5 -d float -o sum --json "$OUT_DIR/comm_reduce_scatter_fp32.json"
  # Live discovery and binding on this machine, then setup_cluster + bind_rank on live ranks (TP 1,
  # G = the GPUs): one GPU and its NUMA cpuset each.
  part cluster_setup_test 120 "$BIN/cluster_setup_test" "$BIN/gtp-launch" "$BIN/cluster_setup_worker" --gtest_brief=1 \
    --gtest_filter='ClusterSetup.LiveDiscovery*:ClusterSetup.Bind*'
  mkdir -p "$OUT_DIR/cluster_setup"
  part cluster_setup_live 120 "$BIN/gtp-launch" -n "$gpus" --timeout 120 -- "$BIN/cluster_setup_worker" live 1 "$gpus" \
    "$OUT_DIR/cluster_setup"
  for format in bf16 fp8 mxfp8 nvfp4; do  # checked against the CPU reference, then pack + gather + unpack vs BF16
    part "check_wire_$format" 90 "$BIN/gtp-launch" -n "$gpus" --timeout 300 -- "$BIN/gtp-bench" all_gather \
      -b 4M -e 64M -f 4 -n 2 -w 1 -c 1 --format "$format"
    part "comm_all_gather_wire_$format" 120 "$BIN/gtp-launch" -n "$gpus" --timeout 300 -- "$BIN/gtp-bench" all_gather \
      -b 16M -e 1G -f 4 -n 20 -w 5 -c 0 --format "$format" --json "$OUT_DIR/comm_all_gather_wire_$format.json"
  done
  grep -hE "^\[0\] .*(gtp_wire|#wrong|nccl )" "$OUT_DIR"/*wire*.log | grep gtp_wire | head -40
}

step_topology() {  # the live machine: hwloc + CUDA driver + NVML
  part gtp-topo - "$BIN/gtp-topo" probe
  "$BIN/gtp-topo" probe --json > "$OUT_DIR/topology.json" 2>&1
}

step_profile() {  # one launch of each unpack/pack kernel; clocks left alone (Firecracker runtime)
  local mib=${GTP_PROFILE_MIB:-64} kernels='regex:unpack_bf16_kernel|pack_(fp8|mxfp8|nvfp4_1d)_kernel'
  local metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
dram__bytes_read.sum,dram__bytes_write.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,\
sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,\
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,\
l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,\
l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,\
launch__registers_per_thread,launch__grid_size,launch__block_size,sm__maximum_warps_per_active_cycle_pct
  part ncu_full 180 ncu --clock-control none --set full -k "$kernels" --launch-count 40 \
    "$BIN/gtp-kernel-bench" --sizes-mib "$mib" --warmup 1 --iters 1
  part ncu_metrics 90 ncu --clock-control none --metrics "$metrics" -k "$kernels" --csv \
    "$BIN/gtp-kernel-bench" --sizes-mib "$mib" --warmup 1 --iters 1
  part sass 30 cuobjdump --dump-sass --gpu-architecture sm_90 "$BIN/gtp-kernel-bench"
  grep -E "unpack_bf16_kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issued Ipc|One or More Eligible|Stall" \
    "$OUT_DIR/ncu_full.log" | head -120
}

step_python() {
  if python3 -c 'import pytest' 2>/dev/null; then  # Linear, GroupedLinear, GEMM-layout tensors
    part pytest_cuda 200 python3 -m pytest -q -rs -p no:cacheprovider bindings/python/tests/test_torch.py \
      bindings/python/tests/test_torch_grouped.py -k cuda
    grep -E "^(FAILED|ERROR)|^E |passed|failed" "$OUT_DIR/pytest_cuda.log" | head -n 40
  else
    echo "pytest is not installed for $(command -v python3): the gtp.torch CUDA tests are not run"
  fi
  # GTP off and on over the CUDA backend on one GPU (G = 1, a real NCCL communicator).
  part train_gpt - python3 bindings/python/examples/train_gpt.py --ranks 1 --backend cuda --steps 50 \
    --machinery-at-g1 --json "$OUT_DIR/train_gpt_cuda.json"
  tail -n 25 "$OUT_DIR/train_gpt.log"
}

te_versions() {
  python3 -c "import torch, transformer_engine as te, transformer_engine.pytorch; print('torch', torch.__version__, 'TE', te.__version__)"
}

step_te_tests() {
  te_versions
  part pytest_te - python3 -m pytest -q -rs -p no:cacheprovider bindings/python/tests/test_te.py \
    bindings/python/tests/test_te_protocol.py bindings/python/tests/test_te_nvfp4_g2.py
  grep -E "^(FAILED|ERROR)|^E  |passed|failed" "$OUT_DIR/pytest_te.log" | head -n 60
}

step_te_memcheck() {  # memory errors only: TE's sm_90 bundle probes kernels it lacks (API errors)
  part memcheck_te - compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider bindings/python/tests/test_te.py \
    -k "test_te_layer_trains and (linear_column or grouped_linear) and not main_grad and (fp8_wire or not wire)"
  grep -E "ERROR SUMMARY|passed|failed|Invalid|^E  " "$OUT_DIR/memcheck_te.log" | head -n 30
}

step_te_stack() {
  # shellcheck disable=SC2086  # GTP_TE_BENCH_ARGS is a list of arguments
  part te_stack_bench - python3 bench/te/te_stack_bench.py --json "$OUT_DIR/te_stack_bench.json" \
    --commit "$GTP_COMMIT" ${GTP_TE_BENCH_ARGS:-}
  tail -n 20 "$OUT_DIR/te_stack_bench.log"
}

step_g1_machinery() {
  # shellcheck disable=SC2086  # GTP_G1_ARGS is a list of arguments
  local impl
  part g1_machinery 180 python3 bench/te/te_stack_bench.py --sides off,off_control,off_ctx,inert,machinery,megatron \
    --modes bf16,fp8 --microbatches 4 --keep on --steps 30 --max-steps 60 \
    --json "$OUT_DIR/g1_machinery.json" --commit "$GTP_COMMIT" ${GTP_G1_ARGS:-}
  grep -E "^(bf16|fp8)|machinery overhead|host us|model MiB|Error|error" "$OUT_DIR/g1_machinery.log" | head -n 40
  for impl in libgtp megatron; do
    part "g1_gpt_$impl" 75 python3 bench/megatron/g1_machinery_gpt.py --impl "$impl" \
      --json "$OUT_DIR/g1_gpt_$impl.json" --commit "$GTP_COMMIT"
    grep -E "^(libgtp|megatron):|host us|Error|error" "$OUT_DIR/g1_gpt_$impl.log" | head -n 10
  done
}

step_te_nvfp4() {  # the G = 2 test skips, saying so, on one GPU
  part pytest_nvfp4 - python3 -m pytest -q -rs -p no:cacheprovider bindings/python/tests/test_te.py -k nvfp4 \
    bindings/python/tests/test_te_nvfp4_g2.py
  grep -E "^(FAILED|ERROR)|^E  |^SKIPPED|passed|failed|skipped" "$OUT_DIR/pytest_nvfp4.log" | head -n 40
}

step_megatron() {  # each part in its own process under its own limit: one failure hides nothing else
  local part_name
  declare -A limits=([gpt]=90 [moe]=90 [ckpt]=75 [fp8]=60 [recompute]=60)
  python3 -c "import torch, transformer_engine as te, transformer_engine.pytorch, megatron.core; print('torch', torch.__version__, 'TE', te.__version__, 'megatron-core ok')"
  for part_name in ${GTP_MEGATRON_PARTS:-gpt moe ckpt fp8 recompute}; do
    part "megatron_$part_name" "${limits[$part_name]:-90}" python3 bench/megatron/megatron_bench.py --part "$part_name" \
      --json "$OUT_DIR/megatron_$part_name.json" --commit "$GTP_COMMIT"
    grep -E '"ok"|bit_identical|max_rel|within_bound|identical_continuation|time_ratio|peak_ratio|"error"|ms/step' \
      "$OUT_DIR/megatron_$part_name.log" | head -n 40
  done
  python3 - "$OUT_DIR" <<'PY'
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
}

# Real NCCL peers on ONE GPU (docs/real-peers.md): every G > 1 device path with G processes that are
# real NCCL ranks sharing the GPU (gtp-launch --share-gpu / gtp.shared_gpu), and libgtp against
# Megatron-Core's own GTP. Correctness and counts only: the ranks are time-sliced and talk over
# loopback sockets, so no timing here means anything. GTP_PEERS_STEPS=REGEX runs only the parts whose
# names match (h2h_g2 runtime_g2 failure diverge te train_g2 runtime_g4 h2h_g4 h2h_g4_ring train_g4
# memcheck memcheck_wires runtime_g8, in that order).
peers_part() {  # peers_part NAME LIMIT COMMAND...
  if [ -n "${GTP_PEERS_STEPS:-}" ] && ! [[ $1 =~ $GTP_PEERS_STEPS ]]; then return; fi
  part "$@"
}

step_peers() {
  VERDICT="$VERDICT|^h2h |^\[ +(OK|FAILED|PASSED|SKIPPED) +\]|rank [0-9]+: .*status=|parity_ok|G = "
  local h2h=(python3 bench/megatron/head_to_head.py --steps 8 --commit "${GTP_COMMIT:-unknown}")
  local train=(python3 bindings/python/examples/train_gpt.py --backend cuda --share-gpu --steps 20
               --wires bf16,fp8,mxfp8,nvfp4)
  peers_part h2h_g2 420 "${h2h[@]}" --world 2 --variants gpt,fused --json "$OUT_DIR/h2h_g2.json"
  peers_part runtime_g2 400 env GTP_REAL_PEERS_SIZES=2 "$BIN/real_peers_runtime_test" "$BIN/gtp-launch" \
    "$BIN/runtime_worker" --gtest_output="json:$OUT_DIR/runtime_g2.gtest.json"
  # Killed and stopped peers, ranks that disagree (tests/real_peers:real_peers_failure_test).
  peers_part failure 300 "$BIN/real_peers_failure_test" "$BIN/gtp-launch" "$BIN/failure_worker" \
    --gtest_output="json:$OUT_DIR/failure.gtest.json"
  # The divergence scenario alone, every rank's lines in its log.
  peers_part diverge 120 env NCCL_DEBUG=WARN "$BIN/gtp-launch" --share-gpu -n 2 --timeout 100 -- \
    "$BIN/failure_worker" diverge
  peers_part te 400 python3 -m pytest -q -p no:cacheprovider -s bindings/python/tests/test_real_peers_te.py \
    --junitxml="$OUT_DIR/te.junit.xml"
  peers_part train_g2 300 "${train[@]}" --ranks 2 --json "$OUT_DIR/train_gpt_shared_g2.json"
  peers_part runtime_g4 400 env GTP_REAL_PEERS_SIZES=4 "$BIN/real_peers_runtime_test" "$BIN/gtp-launch" \
    "$BIN/runtime_worker" --gtest_output="json:$OUT_DIR/runtime_g4.gtest.json"
  peers_part h2h_g4 420 "${h2h[@]}" --world 4 --variants gpt,fused --json "$OUT_DIR/h2h_g4.json"
  # The summation-order question: both implementations on NCCL's ring algorithm.
  peers_part h2h_g4_ring 300 env NCCL_ALGO=Ring "${h2h[@]}" --world 4 --variants gpt --json "$OUT_DIR/h2h_g4_ring.json"
  peers_part train_g4 300 "${train[@]}" --ranks 4 --json "$OUT_DIR/train_gpt_shared_g4.json"
  # API errors not reported: NCCL probes kernels without an sm_90 image (cudaFuncGetAttributes).
  peers_part memcheck 400 "$BIN/gtp-launch" --share-gpu -n 2 --timeout 380 -- compute-sanitizer --tool memcheck \
    --report-api-errors no --error-exitcode 9 "$BIN/runtime_worker" \
    --gtest_filter=RealPeersRuntime.KeepGatheredMatchesTheHostBackend
  # The memcheck coverage one_gpu_rig_runtime_test had (retired): every wire, undefined grads, at G = 2.
  peers_part memcheck_wires 400 "$BIN/gtp-launch" --share-gpu -n 2 --timeout 380 -- compute-sanitizer --tool memcheck \
    --report-api-errors no --error-exitcode 9 "$BIN/runtime_worker" \
    --gtest_filter='RealPeersRuntime.EveryWire*:RealPeersRuntime.UndefinedGrads*'
  peers_part runtime_g8 400 env GTP_REAL_PEERS_SIZES=8 "$BIN/real_peers_runtime_test" "$BIN/gtp-launch" \
    "$BIN/runtime_worker" --gtest_output="json:$OUT_DIR/runtime_g8.gtest.json"
}

# Megatron Bridge's unmodified pretrain on libgtp (docs/bridge.md): its wheels unpacked once (only
# those the machine lacks, tools/gpu/bridge_wheels.py), then bench/bridge/bridge_gpu.py, every case in
# its own processes. GTP_BRIDGE_ARGS adds arguments (e.g. --cases dense_g1,g2_peers).
step_bridge() {
  local wheels=$STAGE/wheels/bridge site=$STAGE/bridge
  if [ ! -d "$wheels" ]; then
    echo "bridge: $wheels is not staged (tools/gpu/stage.sh downloads it when ../shared/te-h200 is present)" >&2
    exit 127
  fi
  [ -f "$site/.unpacked" ] || { python3 tools/gpu/bridge_wheels.py unpack "$wheels" "$site" && touch "$site/.unpacked"; } || exit 127
  export PYTHONPATH=$PYTHONPATH:$site  # holds only what the machine lacked (bridge_wheels.py unpack)
  # shellcheck disable=SC2086  # GTP_BRIDGE_ARGS is a list of arguments
  part bridge_gpu - python3 bench/bridge/bridge_gpu.py --json "$OUT_DIR/bridge_gpu.json" --workdir "$OUT_DIR/runs" \
    --commit "${GTP_COMMIT:-unknown}" ${GTP_BRIDGE_ARGS:-}
  grep -E "^(== |[a-z0-9_]+: (PASS|FAIL)|bridge_gpu:|SKIP)" "$OUT_DIR/bridge_gpu.log" | cut -c1-600
}

# GTP_H2H_ARGS: head_to_head.py's arguments; several runs (each its own world size) separated by ';',
# e.g. "--world 4 --variants moe,tp2,pp2vpp,ckpt; --world 2 --variants moe". Run i writes
# head_to_head.json (the first), head_to_head_2.json, ...
step_h2h() {
  VERDICT="$VERDICT|^h2h "
  local h2h_runs run i=0 name
  IFS=';' read -ra h2h_runs <<< "${GTP_H2H_ARGS:---world 2 --variants gpt,fused}"
  for run in "${h2h_runs[@]}"; do
    i=$((i + 1))
    name=head_to_head$([ "$i" = 1 ] || echo "_$i")
    # shellcheck disable=SC2086  # each run is a list of arguments
    part "$name" - python3 bench/megatron/head_to_head.py --json "$OUT_DIR/$name.json" \
      --commit "${GTP_COMMIT:-unknown}" $run
    grep -E "^h2h |^  (rank|save|load)" "$OUT_DIR/$name.log" | head -n 60
  done
}

step_mlm() {
  # shellcheck disable=SC2086  # GTP_MLM_ARGS is a list of arguments
  part pretrain_gpu - python3 bench/megatron/pretrain_gpu.py --json "$OUT_DIR/pretrain_gpu.json" \
    --commit "${GTP_COMMIT:-unknown}" ${GTP_MLM_ARGS:-}
  grep -E "^G=|^pretrain_gpu.py:" "$OUT_DIR/pretrain_gpu.log" | head -n 20
}

# The one-GPU rig (issue 23; testing/rig/one_gpu_rig.h, docs/rig.md): G = 2, 4, 8 ranks as threads on
# one GPU, a test double for NCCL kept for what real peers cannot show (docs/rig.md, "Its place now"):
# its own collectives, the divergence cases, and every rank in one compute-sanitizer run. Cheapest and
# most diagnostic first. GTP_RIG_STEPS=REGEX runs only the parts whose names match. Output is
# line-buffered, so a killed part still leaves its log; a hung rig ends with the watchdog's report
# (which rank, which communicator, issued / completed) after GTP_RIG_WATCHDOG_S.
rig_part() {  # rig_part NAME LIMIT COMMAND...
  if [ -n "${GTP_RIG_STEPS:-}" ] && ! [[ $1 =~ $GTP_RIG_STEPS ]]; then return; fi
  part "$@"
}

step_rig() {
  # The rig sets both itself before CUDA starts; exported here too so that the logs say so.
  export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_MODULE_LOADING=EAGER
  export GTP_RIG_WATCHDOG_S=${GTP_RIG_WATCHDOG_S:-60}
  VERDICT="$VERDICT|flags by|one-GPU rig|^rank [0-9]"
  local tool g
  # Ranks waiting for each other from CUDA graphs, by launch pattern (stalls are bounded and counted).
  rig_part probe 60 "$BIN/gtp-graph-launch-probe" --ranks 2,4,8 --repeats 3 --fills 16 --timeout-ms 2000
  grep -E "^(pattern|eager|record|prebuilt|two-branch)" "$OUT_DIR/probe.log" 2>/dev/null
  # G = 2 only, the rig's two flag modes.
  rig_part smoke_kernels 45 env GTP_RIG_FLAGS=kernels "$BIN/one_gpu_rig_test" --gtest_filter='*G1:*G2'
  rig_part smoke_memops 45 env GTP_RIG_FLAGS=memops "$BIN/one_gpu_rig_test" --gtest_filter='*G1:*G2'
  # The rig's collectives against their definitions.
  rig_part rig_test 90 "$BIN/one_gpu_rig_test"
  # Ranks that disagree (issue 21), the eager cases at G = 2, 4: every rank must report it. The runtime
  # scenario runs on real NCCL peers (the peers step, docs/real-peers.md).
  rig_part rig_diverge 90 "$BIN/one_gpu_rig_diverge_test" --gtest_filter='-*FillGraph*'
  # Host-rendezvous flags (GTP_RIG_FLAGS=host: what the sanitizer parts use).
  rig_part rig_diverge_host 90 env GTP_RIG_FLAGS=host "$BIN/one_gpu_rig_diverge_test" --gtest_filter='-*FillGraph*'
  # compute-sanitizer runs kernels one at a time: spinning flags deadlock there, and host-rendezvous
  # collectives cannot be captured, so eager cases with host flags (API errors reported: no NCCL here).
  # One run sees every rank (threads of one process).
  rig_part rig_test_memcheck 120 env GTP_RIG_FLAGS=host compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BIN/one_gpu_rig_test" --gtest_filter='*MatchTheirDefinitions*:*Interleave*'
  rig_part rig_diverge_memcheck 150 env GTP_RIG_FLAGS=host compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BIN/one_gpu_rig_diverge_test" --gtest_filter='*G2:*AnotherWeight*G4-*FillGraph*'
  for tool in racecheck synccheck; do
    rig_part "rig_diverge_$tool" 90 env GTP_RIG_FLAGS=host compute-sanitizer --tool $tool --error-exitcode 9 \
      "$BIN/one_gpu_rig_diverge_test" --gtest_filter='*G2-*FillGraph*'
  done
  for g in 2 4; do  # each G in its own process: a stall's trap would fail every later case in one
    rig_part "rig_diverge_graphs_g$g" 60 "$BIN/one_gpu_rig_diverge_test" --gtest_filter="*FillGraph*G$g"
  done
}

# Do one_gpu_rig_test's stalls come from its staged copies sharing copy-engine queues (docs/rig.md)?
# Fresh processes alternate GTP_RIG_STAGE=copy-engine (cudaMemcpyAsync, the default) and kernel
# (rig::copy_bytes), each under GTP_RIG_STAGE_LIMIT s (a pass takes about 1.5 s on an H100; a stall
# is killed and counted), GTP_RIG_STAGE_RUNS of each (default 10); then the kernel mode under
# memcheck with host-rendezvous flags. rig_stage.json gets one record per process, written after each.
step_rig_stage() {
  export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_MODULE_LOADING=EAGER GTP_RIG_WATCHDOG_S=6
  local runs=${GTP_RIG_STAGE_RUNS:-10} limit=${GTP_RIG_STAGE_LIMIT:-10} records=() memcheck_rc=null i mode log rc start wall
  write_rig_stage_json() {
    {
      echo "{\"machine\": \"$GTP_CARD\", \"commit\": \"$GTP_COMMIT\","
      echo " \"command\": \"GTP_RIG_STAGE_RUNS=$runs GTP_RIG_STAGE_LIMIT=$limit tools/gpu/run.sh rig_stage\","
      echo " \"memcheck_kernel_stage_rc\": $memcheck_rc, \"runs\": ["
      (IFS=,; echo "  ${records[*]}")
      echo "]}"
    } > "$OUT_DIR/rig_stage.json"
  }
  mkdir -p "$OUT_DIR/logs"
  for ((i = 0; i < runs; ++i)); do
    for mode in copy-engine kernel; do
      log="$OUT_DIR/logs/$mode-$i.log"
      start=$EPOCHREALTIME
      GTP_RIG_STAGE=$mode timeout -s KILL "$limit" stdbuf -oL -eL "$BIN/one_gpu_rig_test" --gtest_brief=1 > "$log" 2>&1
      rc=$?
      wall=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
      [ $rc -eq 0 ] && rm -f "$log"
      records+=("{\"mode\": \"$mode\", \"run\": $i, \"rc\": $rc, \"wall_s\": $wall}")
      echo "$mode run $i: rc=$rc ${wall}s"
      [ $rc -eq 0 ] || [ $rc -eq 137 ] || STEP_STATUS=1
      write_rig_stage_json
    done
  done
  part kernel_memcheck 60 env GTP_RIG_STAGE=kernel GTP_RIG_FLAGS=host compute-sanitizer --tool memcheck \
    --error-exitcode 9 "$BIN/one_gpu_rig_test" --gtest_brief=1 --gtest_filter='*MatchTheirDefinitions*:*Interleave*'
  memcheck_rc=$?
  write_rig_stage_json
}

# Multi-GPU (issue 7): N = the visible GPUs, one rank per GPU, gtp_remat groups of N (and of N/2, a
# TP 2 profile, when N >= 4). Every mg_ step writes its JSON into $RUN_DIR/multi_gpu, which
# mg_summary reads (bench/multi_gpu_summary.py: the tables against the targets).

# grid_profile N TP PATH: a profile of N ranks on one host of N GPUs, TP = TP, gtp_remat groups of N / TP.
grid_profile() {
  local n=$1 tp=$2 path=$3 gpus="" i
  for ((i = 0; i < n; i++)); do gpus+="${gpus:+, }{\"index\": $i}"; done
  cat > "$path" <<EOF
{"schema_version": 1, "name": "multi-gpu-tp$tp",
 "cluster": {"template": {"host_count": 1, "host": {"gpus": [$gpus]}}},
 "parallel": {"world_size": $n, "tensor_model_parallel_size": $tp, "tensor_parallel_num_weight_shards": $n}}
EOF
}

# Sets N, HALF, MG (the shared folder), LAUNCH and GTP_BENCH, or refuses (exit 2) below 2 GPUs.
mg_setup() {
  local gpus
  # The visible GPUs: CUDA_VISIBLE_DEVICES when set (possibly empty), else nvidia-smi's list.
  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    gpus=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .)
  else
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  fi
  if [ "$gpus" -lt 2 ]; then
    echo "$STEP_NAME: $gpus GPU(s) visible; the multi-GPU steps need at least 2: run them on nvidia-h100-x2" \
         "(or -x4, -x8, nvidia-h200-x2 ...)" >&2
    exit 2
  fi
  N=$gpus HALF=$((gpus / 2)) MG=$RUN_DIR/multi_gpu
  LAUNCH=("$BIN/gtp-launch" -n "$N" --)
  GTP_BENCH=("${LAUNCH[@]}" "$BIN/gtp-bench")
  if [ ! -d "$MG" ]; then
    mkdir -p "$MG"
    echo "$N GPU(s), gtp_remat G = $N$([ "$N" -ge 4 ] && echo " and $HALF (TP 2)"), NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
    nvidia-smi -L
    nvidia-smi topo -m > "$MG/nvidia_smi_topo.txt" 2>&1
    grid_profile "$N" 1 "$MG/profile_g$N.json"
    [ "$N" -ge 4 ] && grid_profile "$N" 2 "$MG/profile_g$HALF.json"
  fi
}
groups() { echo "--profile $MG/profile_g$1.json --group gtp_remat"; }  # the gtp_remat groups of size $1

step_mg_collectives() {  # BF16 1 MiB - 4 GiB: raw NCCL and libgtp's streams in the same run; wires end to end
  mg_setup
  local format
  # shellcheck disable=SC2046  # groups is a list of arguments
  part "ag_bf16_g$N" 100 "${GTP_BENCH[@]}" all_gather $(groups "$N") -b 1M -e 4G -f 2 -n 20 -w 5 -c 0 -d bfloat16 \
    --json "$MG/ag_bf16_g$N.json"
  for format in fp8 mxfp8 nvfp4; do
    # shellcheck disable=SC2046
    part "ag_wire_${format}_g$N" 75 "${GTP_BENCH[@]}" all_gather $(groups "$N") -b 64M -e 1G -f 4 -n 20 -w 5 -c 0 \
      --format "$format" --json "$MG/ag_wire_${format}_g$N.json"
  done
  # shellcheck disable=SC2046  # FP32 sum: the grad finalize
  part "rs_fp32_g$N" 120 "${GTP_BENCH[@]}" reduce_scatter $(groups "$N") -b 1M -e 4G -f 2 -n 20 -w 5 -c 0 -d float \
    -o sum --json "$MG/rs_fp32_g$N.json"
}

step_mg_peer() {  # fully_shard's all-gather, the same sizes
  mg_setup
  part "fsdp2_g$N" - python3 bench/peers/fsdp2_allgather_peer.py -N "$N" -b 1M -e 4G -f 2 -n 20 -w 5 \
    --json "$MG/fsdp2_g$N.json"
}

step_mg_overlap() {  # B = 1; GTP_OVERLAP_M fixes M (default auto: each rank sizes itself)
  mg_setup
  part "overlap_g$N" - "${LAUNCH[@]}" "$BIN/gtp-overlap-bench" --bootstrap ucx --m "${GTP_OVERLAP_M:-auto}" \
    --wires bf16,fp8,mxfp8,nvfp4 --priorities high --depths 1,2 --json "$MG/overlap_g$N.json"
}

step_mg_train() {  # GTP off vs every wire on the CUDA backend, the BF16 checkpoint re-sharded to N/2 and resumed
  mg_setup
  part "train_gpt_g$N" - python3 bindings/python/examples/train_gpt.py --ranks "$N" --backend cuda --steps 50 \
    --reshard-to "$HALF" --reshard-steps 10 --json "$MG/train_gpt_g$N.json"
}

# One process driving two GPUs (the tests' own two-rank setups, real NCCL peers): ranks that gather
# different weights, a failure inside a collective on one rank, communicator pairs that differ.
step_mg_pairs() {
  mg_setup
  local t
  for t in cuda_fill_tags_test cuda_failure_test cuda_backend_test nccl_test; do
    part "${t}_pair" 90 env CUDA_VISIBLE_DEVICES=0,1 "$BIN/$t"
  done
  part fill_tag_cuda_bench_pair 60 env CUDA_VISIBLE_DEVICES=0,1 "$BIN/fill_tag_cuda_bench"
  grep -E '^\{' "$OUT_DIR/fill_tag_cuda_bench_pair.log"
}

step_mg_extras() {
  mg_setup
  local format
  # The fills recorded and launched as CUDA graphs over N ranks (NCCL's rule for captured collectives).
  part "train_gpt_fill_graphs_g$N" 120 python3 bindings/python/examples/train_gpt.py --ranks "$N" --backend cuda \
    --steps 20 --wires bf16,fp8 --fill-graphs 256 --json "$MG/train_gpt_fill_graphs_g$N.json"
  part "overlap_mb4_g$N" 120 "${LAUNCH[@]}" "$BIN/gtp-overlap-bench" --bootstrap ucx --m "${GTP_OVERLAP_M:-auto}" \
    --microbatches 4 --wires bf16,nvfp4 --priorities high --depths 1,2 --json "$MG/overlap_mb4_g$N.json"
  # The configuration that reaches the targets on one GPU: keep_gathered, re-packed every step.
  part "overlap_mb4_keep_g$N" 120 "${LAUNCH[@]}" "$BIN/gtp-overlap-bench" --bootstrap ucx --m "${GTP_OVERLAP_M:-auto}" \
    --microbatches 4 --wires bf16,nvfp4 --priorities high --depths 2 --repack on --keep-gathered on \
    --json "$MG/overlap_mb4_keep_g$N.json"
  if [ "$N" -ge 4 ]; then
    # shellcheck disable=SC2046
    part "ag_bf16_g$HALF" 90 "${GTP_BENCH[@]}" all_gather $(groups "$HALF") -b 1M -e 4G -f 2 -n 20 -w 5 -c 0 \
      -d bfloat16 --json "$MG/ag_bf16_g$HALF.json"
    # shellcheck disable=SC2046
    part "rs_fp32_g$HALF" 100 "${GTP_BENCH[@]}" reduce_scatter $(groups "$HALF") -b 1M -e 4G -f 2 -n 20 -w 5 -c 0 \
      -d float -o sum --json "$MG/rs_fp32_g$HALF.json"
  fi
  for format in fp8 mxfp8 nvfp4; do  # bit-exact against the CPU reference, small sizes
    # shellcheck disable=SC2046
    part "check_wire_${format}_g$N" 60 "${GTP_BENCH[@]}" all_gather $(groups "$N") -b 4M -e 16M -f 4 -n 2 -w 1 -c 1 \
      --format "$format"
    grep -E "^\[0\] .*gtp_wire" "$OUT_DIR/check_wire_${format}_g$N.log" | head -n 2
  done
}

step_mg_summary() {
  local mg=$RUN_DIR/multi_gpu
  [ -d "$mg" ] || { echo "mg_summary: no mg_ step ran before it in this call (nothing in $mg)" >&2; exit 1; }
  part multi_gpu_summary - python3 bench/multi_gpu_summary.py "$mg"
  cat "$OUT_DIR/multi_gpu_summary.log"
}
