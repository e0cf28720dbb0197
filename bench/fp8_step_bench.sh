#!/usr/bin/env bash
# bench/fp8_step_bench.sh: what FP8 costs on the CPU (issue 34): `ampscope train --precision fp8` against
# `--precision bf16` on the same sample, model and batch, each at probe level dtype (no statistics: the run's
# own work) and health (the probe's statistics, FP8 operands' /fp8 rows included), the four runs alternated
# ROUNDS times so that they see the same machine load. A step's time is the /steps field time_ms; each run
# gives the median over its steps after the first two (warm-up), each configuration the median over its rounds.
# The FP8 statistics' share: (fp8 health - fp8 dtype) - (bf16 health - bf16 dtype), the health level's extra
# work that only the FP8 run has, as a fraction of the fp8 health step.
# The premise, checked on every round's traces after timing (bench/premise.py; exits 1 with "premise broken"):
# each run is complete with STEPS steps in the precision named; the fp8 health run has /fp8 rows in every step and
# the bf16 runs none; the fp8 runs' losses differ from the bf16 runs' (FP8 arithmetic ran) and each precision's
# dtype and health runs have the same losses bit for bit (the probe level changes only what is recorded).
# Results: bench/RESULTS.md.
#
#   bench/fp8_step_bench.sh BIN [SAMPLE] [STEPS] [ROUNDS] [BATCH]     # BIN: the ampscope binary
set -euo pipefail

ampscope=${1:?usage: bench/fp8_step_bench.sh BIN [SAMPLE] [STEPS] [ROUNDS] [BATCH]}
sample=${2:-mlp}
steps=${3:-30}
rounds=${4:-3}
batch=${5:-64}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# step_ms, median
source "$(dirname "${BASH_SOURCE[0]}")/step_times.sh"

declare -A runs
for ((r = 0; r < rounds; ++r)); do
  for precision in bf16 fp8; do
    for level in dtype health; do
      "$ampscope" train --sample "$sample" --device cpu --precision "$precision" --probe "$level" --steps "$steps" \
        --batch "$batch" --out "$work/$r.$precision.$level.h5" --overwrite >/dev/null
      runs[$precision.$level]+="$(step_ms "$work/$r.$precision.$level.h5") "
    done
  done
done
for ((r = 0; r < rounds; ++r)); do
  t="$work/$r"
  premise fp8_step_bench "$t.bf16.dtype.h5" --steps "$steps" --precision bf16 --rows fp8=none
  premise fp8_step_bench "$t.bf16.health.h5" --steps "$steps" --precision bf16 --rows fp8=none --same-loss "$t.bf16.dtype.h5"
  premise fp8_step_bench "$t.fp8.dtype.h5" --steps "$steps" --precision fp8 --rows fp8=none --other-loss "$t.bf16.dtype.h5"
  premise fp8_step_bench "$t.fp8.health.h5" --steps "$steps" --precision fp8 --rows fp8=same --same-loss "$t.fp8.dtype.h5"
done
declare -A med
for k in bf16.dtype bf16.health fp8.dtype fp8.health; do med[$k]=$(median ${runs[$k]}); done
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "sample $sample, batch $batch, $steps steps, $rounds rounds (ms per step, medians)"
echo "| probe | bf16 | fp8 | fp8 / bf16 |"
echo "|---|---|---|---|"
for level in dtype health; do
  awk -v l="$level" -v b="${med[bf16.$level]}" -v f="${med[fp8.$level]}" 'BEGIN { printf "| %s | %.3f | %.3f | %.2f |\n", l, b, f, f / b }'
done
awk -v bd="${med[bf16.dtype]}" -v bh="${med[bf16.health]}" -v fd="${med[fp8.dtype]}" -v fh="${med[fp8.health]}" \
  'BEGIN { s = (fh - fd) - (bh - bd); printf "FP8 statistics: %.3f ms of the fp8 health step (%.0f%%)\n", s, 100 * s / fh }'
