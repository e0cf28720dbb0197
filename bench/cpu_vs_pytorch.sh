#!/usr/bin/env bash
# bench/cpu_vs_pytorch.sh: the f32 training step of the sample models (training_bench's f32 cases: forward,
# cross-entropy, backward, no optimizer) against PyTorch's CPU at the same shapes (bench/pytorch_cpu_step.py),
# side by side, at 1 and 2 threads (issue 37):
#
#   bench/cpu_vs_pytorch.sh BUILD [ROUNDS] [MODELS]     # MODELS: comma list of mlp,cnn,transformer,gpt2_small
#
# Each round runs, per thread count, ampscope's `training_bench` (AMPSCOPE_NUM_THREADS=N; the median of 3
# repetitions) and PyTorch (torch.set_num_threads(N); the median step over about 2 s), the order of the two
# swapped every round so that neither always runs first. Both sides report the wall time and the CPU time of
# every thread of the process per step. Prints one line per round, thread count and model, then the medians
# of the per-round ratios (ampscope / PyTorch; below 1 is faster). On a loaded machine read the CPU ratio at
# 1 thread (a step's own work whatever else runs) and the wall ratio at 2 threads with its spread; say the
# load (`uptime` is printed before and after). Needs torch at /usr/bin/python3.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bench/cpu_vs_pytorch.sh BUILD [ROUNDS] [MODELS]" >&2; exit 2; }
build=$1
rounds=${2:-3}
models=${3:-mlp,cnn,transformer}
bench="$build/bench/training_bench"
here="$(cd "$(dirname "$0")" && pwd)"
[ -x "$bench" ] || { echo "cpu_vs_pytorch: $bench not found (build the training_bench target)" >&2; exit 2; }
# gpt2_small's case is named gpt2_small/f32/iterations:3/real_time.
filter="^($(echo "$models" | tr , '|'))/f32(/|\$)"
results=$(mktemp)
trap 'rm -f "$results"' EXIT

ampscope_side() {  # threads -> lines "model wall_ms cpu_ms"
  AMPSCOPE_NUM_THREADS=$1 "$bench" --benchmark_filter="$filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_format=csv 2>/dev/null |
    awk -F, '$1 ~ /_median"?$/ { name = $1; gsub(/"/, "", name); sub(/\/.*/, "", name);
                                 for (i = 1; i <= NF; ++i) if (h[i] == "all_threads_cpu_ms") cpu = $i;
                                 print name, $3, cpu }
             $1 == "name" { for (i = 1; i <= NF; ++i) { h[i] = $i; gsub(/"/, "", h[i]) } }'
}
pytorch_side() {
  /usr/bin/python3 "$here/pytorch_cpu_step.py" --threads "$1" --models "$models" | awk '{ print $1, $2, $3 }'
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(uptime)"
for r in $(seq 1 "$rounds"); do
  for t in 1 2; do
    if [ $((r % 2)) -eq 1 ]; then
      a=$(ampscope_side "$t"); p=$(pytorch_side "$t")
    else
      p=$(pytorch_side "$t"); a=$(ampscope_side "$t")
    fi
    join <(echo "$a" | sort) <(echo "$p" | sort) | while read -r m aw ac pw pc; do
      echo "$r $t $m $aw $ac $pw $pc" | tee -a "$results" |
        awk '{ printf "round %d, %d thread(s), %-12s ampscope %8.2f ms wall %8.2f ms cpu | pytorch %8.2f wall %8.2f cpu | ratio wall %.2f cpu %.2f\n", $1, $2, $3, $4, $5, $6, $7, $4 / $6, $5 / $7 }'
    done
  done
done
echo "# $(uptime)"
echo "| model | threads | ampscope wall / cpu ms (median) | pytorch wall / cpu ms | ratio wall (rounds) | ratio cpu (rounds) |"
echo "|---|---|---|---|---|---|"
sort -k3,3 -k2,2n -k1,1n "$results" | awk '
  function med(s,   n, v, i, j, t) { n = split(s, v, " "); for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
                                       return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
  { k = $3 " " $2; keys[k] = 1; aw[k] = aw[k] " " $4; ac[k] = ac[k] " " $5; pw[k] = pw[k] " " $6; pc[k] = pc[k] " " $7
    rw[k] = rw[k] sprintf(" %.2f", $4 / $6); rc[k] = rc[k] sprintf(" %.2f", $5 / $7) }
  END { for (k in keys) { split(k, kk, " ")
          printf "| %s | %s | %.2f / %.2f | %.2f / %.2f | **%.2f** (%s) | **%.2f** (%s) |\n", kk[1], kk[2], med(aw[k]), med(ac[k]),
                 med(pw[k]), med(pc[k]), med(rw[k]), substr(rw[k], 2), med(rc[k]), substr(rc[k], 2) } }' | sort
