#!/usr/bin/env bash
# tests/train/thread_count_test.sh: a run's numbers do not depend on the number of CPU threads. The same
# `ampscope train` at AMPSCOPE_NUM_THREADS=1, 2 and 3 must write the same trace rows, bit for bit: every /ops
# and /grads statistic (the probe's sums are chunked by size, not by thread) and every /steps field but the
# step's time (the products' row and column blocks are cut by size, not by thread: kernels/cpu/nn_kernels.cpp,
# for_row_blocks, for_column_blocks). Before that, the transformer in bf16 parted at step 1 between 1 and 2 threads.
#   thread_count_test.sh AMPSCOPE_BINARY SCRATCH_DIR
set -uo pipefail
ampscope=${1:?usage: thread_count_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
work=${2:?usage: thread_count_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
rm -rf "$work" && mkdir -p "$work"
failures=0
for run in "transformer bf16" "transformer fp16" "cnn fp16" "mlp fp32"; do
  read -r sample precision <<<"$run"
  for threads in 1 2 3; do
    name="$sample-$precision-$threads"
    if ! AMPSCOPE_NUM_THREADS=$threads "$ampscope" train --sample "$sample" --precision "$precision" --device cpu \
      --steps 3 --out "$work/$name.h5" >"$work/$name.log" 2>&1; then
      echo "FAIL: $sample $precision at $threads threads did not train:" >&2
      cat "$work/$name.log" >&2
      failures=$((failures + 1))
      continue
    fi
    "$ampscope" export "$work/$name.h5" --csv "$work/$name" >/dev/null
    # /steps without its time_ms column (the 10th).
    cut -d, -f1-9,11- "$work/$name/steps.csv" >"$work/$name/steps-untimed.csv"
  done
  for threads in 2 3; do
    for table in ops.csv grads.csv steps-untimed.csv; do
      if ! cmp -s "$work/$sample-$precision-1/$table" "$work/$sample-$precision-$threads/$table"; then
        echo "FAIL: $sample $precision: $table at $threads threads differs from 1 thread:" >&2
        diff "$work/$sample-$precision-1/$table" "$work/$sample-$precision-$threads/$table" | head -4 >&2
        failures=$((failures + 1))
      fi
    done
  done
done
[[ $failures == 0 ]] && echo "thread_count_test: the same rows at 1, 2 and 3 threads"
exit $((failures > 0))
