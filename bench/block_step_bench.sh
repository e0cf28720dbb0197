#!/usr/bin/env bash
# bench/block_step_bench.sh: what the block-scaled formats cost on the CPU (issue 35): `ampscope train --precision
# mxfp8` and `--precision nvfp4` against `--precision bf16` on the same sample, model and batch, by
# bench/fp8_step_bench.sh's method: each at probe level dtype (no statistics: the run's own work) and health (the
# probe's statistics, the /blocks rows included), the six runs alternated ROUNDS times so that they see the same
# machine load. A step's time is the /steps field time_ms; each run gives the median over its steps after the first
# two (warm-up), each configuration the median over its rounds. The block statistics' share: (block health - block
# dtype) - (bf16 health - bf16 dtype), as a fraction of the block health step. The mlp's last Linear (10 outputs)
# cannot be blocked: KEEP (default fc3) is kept in bf16 in the block-scaled runs.
# The premise, checked on every round's traces after timing (bench/premise.py; exits 1 with "premise broken"):
# each run is complete with STEPS steps in the precision named; the block-scaled health runs have /blocks rows in
# every step, none of module KEEP, and the bf16 runs none; the block-scaled runs' losses differ from the bf16 runs'
# and from each other's (that format's arithmetic ran), and each precision's dtype and health runs have the same
# losses bit for bit (the probe level changes only what is recorded).
# Results: bench/RESULTS.md.
#
#   bench/block_step_bench.sh BIN [SAMPLE] [STEPS] [ROUNDS] [BATCH] [KEEP]     # BIN: the ampscope binary
set -euo pipefail

ampscope=${1:?usage: bench/block_step_bench.sh BIN [SAMPLE] [STEPS] [ROUNDS] [BATCH] [KEEP]}
sample=${2:-mlp}
steps=${3:-30}
rounds=${4:-3}
batch=${5:-64}
keep=${6:-fc3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# step_ms, median
source "$(dirname "${BASH_SOURCE[0]}")/step_times.sh"

declare -A runs
for ((r = 0; r < rounds; ++r)); do
  for precision in bf16 mxfp8 nvfp4; do
    extra=()
    [[ $precision != bf16 && -n $keep ]] && extra=(--fp8-keep-bf16 "$keep")
    for level in dtype health; do
      "$ampscope" train --sample "$sample" --device cpu --precision "$precision" --probe "$level" --steps "$steps" \
        --batch "$batch" --out "$work/$r.$precision.$level.h5" --overwrite "${extra[@]}" >/dev/null
      runs[$precision.$level]+="$(step_ms "$work/$r.$precision.$level.h5") "
    done
  done
done
for ((r = 0; r < rounds; ++r)); do
  t="$work/$r"
  premise block_step_bench "$t.bf16.dtype.h5" --steps "$steps" --precision bf16 --rows blocks=none
  premise block_step_bench "$t.bf16.health.h5" --steps "$steps" --precision bf16 --rows blocks=none --same-loss "$t.bf16.dtype.h5"
  for precision in mxfp8 nvfp4; do
    other=$([[ $precision == mxfp8 ]] && echo nvfp4 || echo mxfp8)
    premise block_step_bench "$t.$precision.dtype.h5" --steps "$steps" --precision "$precision" --rows blocks=none \
      --other-loss "$t.bf16.dtype.h5"
    keep_check=()
    [[ -n $keep ]] && keep_check=(--no-module "blocks=$keep")
    premise block_step_bench "$t.$precision.health.h5" --steps "$steps" --precision "$precision" --rows blocks=same \
      --same-loss "$t.$precision.dtype.h5" --other-loss "$t.$other.health.h5" "${keep_check[@]}"
  done
done
declare -A med
for k in "${!runs[@]}"; do med[$k]=$(median ${runs[$k]}); done
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "sample $sample, batch $batch, $steps steps, $rounds rounds (ms per step, medians); $keep kept in bf16 in block runs"
echo "| probe | bf16 | mxfp8 | nvfp4 | mxfp8 / bf16 | nvfp4 / bf16 |"
echo "|---|---|---|---|---|---|"
for level in dtype health; do
  awk -v l="$level" -v b="${med[bf16.$level]}" -v m="${med[mxfp8.$level]}" -v n="${med[nvfp4.$level]}" \
    'BEGIN { printf "| %s | %.3f | %.3f | %.3f | %.2f | %.2f |\n", l, b, m, n, m / b, n / b }'
done
for p in mxfp8 nvfp4; do
  awk -v p="$p" -v bd="${med[bf16.dtype]}" -v bh="${med[bf16.health]}" -v fd="${med[$p.dtype]}" -v fh="${med[$p.health]}" \
    'BEGIN { s = (fh - fd) - (bh - bd); printf "%s statistics: %.3f ms of the %s health step (%.0f%%)\n", p, s, p, 100 * s / fh }'
done
