#!/usr/bin/env bash
# Nsight Compute profile of the wire-format kernels on the GPU machine (Firecracker runtime; clocks
# left alone). Profiles one launch of each unpack/pack kernel at the given shard size and writes
# the per-kernel details, the SASS of the kernel object, and a short summary to $OUT/profile.tgz.
#   bench/profile_h200.sh [MiB]          (default 64)
set -uo pipefail
source bench/gpu_env.sh
mib=${1:-64}
bin=.carry/bin
out=${OUT:-/tmp/gtp-out}
work=$(mktemp -d)
trap 'tar czf "$out/profile.tgz" -C "$work" .' EXIT
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
dram__bytes_read.sum,dram__bytes_write.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,\
sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,\
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,\
l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,\
l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,\
launch__registers_per_thread,launch__grid_size,launch__block_size,sm__maximum_warps_per_active_cycle_pct
# One launch per kernel name (the benchmark's first timed-set launch), full section set.
ncu --clock-control none --set full -k regex:'unpack_bf16_kernel|pack_(fp8|mxfp8|nvfp4_1d)_kernel' \
    --launch-count 40 \
    $bin/gtp-kernel-bench --sizes-mib "$mib" --warmup 1 --iters 1 > "$work/ncu_full.txt" 2>&1
echo "ncu full exit $?"
ncu --clock-control none --metrics "$metrics" -k regex:'unpack_bf16_kernel|pack_(fp8|mxfp8|nvfp4_1d)_kernel' \
    --csv $bin/gtp-kernel-bench --sizes-mib "$mib" --warmup 1 --iters 1 > "$work/ncu_metrics.csv" 2>&1
echo "ncu metrics exit $?"
cuobjdump --dump-sass --gpu-architecture sm_90 $bin/gtp-kernel-bench > "$work/sass.txt" 2>&1
echo "sass lines $(wc -l < "$work/sass.txt")"
grep -E "unpack_bf16_kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issued Ipc|One or More Eligible|Stall" "$work/ncu_full.txt" | head -120
