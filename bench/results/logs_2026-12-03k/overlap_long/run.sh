#!/usr/bin/env bash
# The overlap headline (BF16, 4 microbatches, keep_gathered, re-packed every step, depth 2, high
# priority) with longer medians: 60 steps after 10 warm-up, grads into the main grad on / off / on / off / on.
source bench/gpu_env.sh
x=$OUT/x; mkdir -p $x
bin=.carry/bin
i=0
for into in on off on off on; do
  i=$((i + 1))
  timeout 90 $bin/gtp-overlap-bench --wires bf16 --depths 2 --priorities high --repack on --microbatches 4 \
    --keep-gathered on --grads-into-main-grad $into --iters 60 --warmup 10 \
    --json $x/overlap_long_${i}_into$into.json > $x/overlap_long_${i}_into$into.log 2>&1
  echo "overlap_long_${i}_into$into rc=$?" >> $x/rc.txt
done
cd $OUT && tar czf results.tgz x && rm -rf x
