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
# The premise, checked after each round's pair of runs (exits 1 with "cpu_vs_pytorch: premise broken: expected X,
# found Y"): both sides timed every model asked; they trained the same model (the same number of parameter tensors
# and elements: training_bench's counters param_tensors and param_elements, from its --benchmark_out JSON where
# they are exact, and pytorch_cpu_step.py's columns 5 and 6)
# on the thread count asked (training_bench's counter pool_threads, the CPU pool's size; torch.get_num_threads());
# at 1 thread, neither side used a second core (median CPU time at most 1.15 x the wall time: Debian's torch ran
# its matrix products on OpenBLAS's own pool of 2 threads whatever torch.set_num_threads said, which
# pytorch_cpu_step.py now sizes; before 2026-11-29 its "1 thread" figures were 2 threads); a
# broken premise of either side's own (a non-finite loss, a missing gradient) stops the run with the side's error.
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
errors=$(mktemp) ran=$(mktemp) ran_pytorch=$(mktemp)
trap 'rm -f "$results" "$errors" "$ran" "$ran_pytorch"' EXIT

ampscope_side() {  # threads -> lines "model wall_ms cpu_ms"; what ran (counters) in $ran as JSON
  AMPSCOPE_NUM_THREADS=$1 "$bench" --benchmark_filter="$filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_format=csv --benchmark_out="$ran" \
    --benchmark_out_format=json 2>"$errors" |
    awk -F, '$1 ~ /_median"?$/ { name = $1; gsub(/"/, "", name); sub(/\/.*/, "", name);
                                 for (i = 1; i <= NF; ++i) if (h[i] == "all_threads_cpu_ms") cpu = $i;
                                 print name, $3, cpu }
             $1 == "name" { for (i = 1; i <= NF; ++i) { h[i] = $i; gsub(/"/, "", h[i]) } }' ||
    { echo "cpu_vs_pytorch: premise broken: expected training_bench to exit 0, found:" >&2; cat "$errors" >&2; exit 1; }
}
pytorch_side() {  # threads -> lines "model wall_ms cpu_ms"; what ran in $ran_pytorch
  /usr/bin/python3 "$here/pytorch_cpu_step.py" --threads "$1" --models "$models" >"$ran_pytorch"
  awk '{ print $1, $2, $3 }' "$ran_pytorch"
}
# premise THREADS: every model asked timed on both sides, the same parameters, the threads asked (read from
# training_bench's JSON, where counters are exact, and pytorch_cpu_step.py's columns 5 to 7).
premise() {
  /usr/bin/python3 - "$1" "$models" "$ran" "$ran_pytorch" <<'PY' || exit 1
import json, sys
threads, models, ran, ran_pytorch = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3], sys.argv[4]
ours = {}
for b in json.load(open(ran))["benchmarks"]:
    if b.get("aggregate_name") == "median":
        ours[b["name"].split("/")[0]] = (int(b["param_tensors"]), int(b["param_elements"]), int(b["pool_threads"]),
                                         float(b["real_time"]), float(b["all_threads_cpu_ms"]))
theirs = {}
for line in open(ran_pytorch):
    f = line.split()
    theirs[f[0]] = (int(f[4]), int(f[5]), int(f[6]), float(f[1]), float(f[2]))
def broken(expected, found):
    sys.exit(f"cpu_vs_pytorch: premise broken: expected {expected}, found {found}")
for m in models:
    if m not in ours or m not in theirs:
        broken(f"{m} timed on both sides at {threads} thread(s)", f"ampscope {sorted(ours)}, pytorch {sorted(theirs)}")
    if ours[m][:2] != theirs[m][:2]:
        broken(f"the same model on both sides ({m})", f"ampscope {ours[m][0]} parameter tensors of {ours[m][1]} "
               f"elements, pytorch {theirs[m][0]} of {theirs[m][1]}")
    if ours[m][2] != threads or theirs[m][2] != threads:
        broken(f"{threads} thread(s) on both sides ({m})", f"ampscope {ours[m][2]}, pytorch {theirs[m][2]}")
    for side, (wall, cpu) in (("ampscope", ours[m][3:]), ("pytorch", theirs[m][3:])):
        if threads == 1 and cpu > 1.15 * wall:
            broken(f"{side} on one core at 1 thread ({m}: CPU time at most 1.15 x wall)",
                   f"{cpu:.2f} ms CPU in {wall:.2f} ms wall (a library's own thread pool?)")
PY
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(uptime)"
for r in $(seq 1 "$rounds"); do
  for t in 1 2; do
    if [ $((r % 2)) -eq 1 ]; then
      a=$(ampscope_side "$t"); p=$(pytorch_side "$t")
    else
      p=$(pytorch_side "$t"); a=$(ampscope_side "$t")
    fi
    premise "$t"
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
