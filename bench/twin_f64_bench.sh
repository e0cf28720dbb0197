#!/usr/bin/env bash
# bench/twin_f64_bench.sh: the cost of `ampscope train --twin-f64` (f32 ops twinned in f64 too) beside --twin, per
# sample (mlp, cnn, transformer) in fp32 (where only --twin-f64 twins anything) and fp16, at probe level health,
# the three runs of a sample and precision alternated ROUNDS times so they see the same machine load.
# A run's step time is the median of its /steps time_ms after the first two steps; each configuration's the
# median over its rounds; ratios are against the untwinned run of the same precision.
# The premise, checked on every run's trace after a configuration's rounds (bench/premise.py; exits 1 with "premise
# broken"): each run is complete with STEPS steps in the precision named; the plain run has no /precision rows; in
# fp32 --twin has none either and --twin-f64 the same number in every step; in fp16 --twin has the same number in
# every step and --twin-f64 more than --twin in every step (the f32 ops twinned too); every run's losses equal the
# plain run's bit for bit (the twin only watches the run).
# Results: bench/RESULTS.md.
#
#   bench/twin_f64_bench.sh build [STEPS] [ROUNDS]     # build: the build folder holding bin/ampscope
set -euo pipefail

build=${1:?usage: bench/twin_f64_bench.sh BUILD_DIR [STEPS] [ROUNDS]}
steps=${2:-10}
rounds=${3:-2}
ampscope="$build/bin/ampscope"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# step_ms, median
source "$(dirname "${BASH_SOURCE[0]}")/step_times.sh"

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| sample | precision | plain ms/step | --twin ms/step | ratio | --twin-f64 ms/step | ratio |"
echo "|---|---|---|---|---|---|---|"
for sample in mlp cnn transformer; do
  for precision in fp32 fp16; do
    plain=() twin=() f64=()
    for ((r = 0; r < rounds; ++r)); do
      for mode in plain twin f64; do
        case $mode in
          plain) extra=() ;;
          twin) extra=(--twin) ;;
          f64) extra=(--twin-f64) ;;
        esac
        "$ampscope" train --overwrite --sample "$sample" --precision "$precision" --device cpu --steps "$steps" --probe health \
          --out "$work/$r.$mode.h5" "${extra[@]}" >/dev/null
        ms=$(step_ms "$work/$r.$mode.h5")
        case $mode in
          plain) plain+=("$ms") ;;
          twin) twin+=("$ms") ;;
          f64) f64+=("$ms") ;;
        esac
      done
    done
    for ((r = 0; r < rounds; ++r)); do
      t="$work/$r"
      premise twin_f64_bench "$t.plain.h5" --steps "$steps" --precision "$precision" --rows precision=none
      if [[ $precision == fp32 ]]; then
        premise twin_f64_bench "$t.twin.h5" --steps "$steps" --precision fp32 --rows precision=none --same-loss "$t.plain.h5"
        premise twin_f64_bench "$t.f64.h5" --steps "$steps" --precision fp32 --rows precision=same --same-loss "$t.plain.h5"
      else
        premise twin_f64_bench "$t.twin.h5" --steps "$steps" --precision "$precision" --rows precision=same --same-loss "$t.plain.h5"
        premise twin_f64_bench "$t.f64.h5" --steps "$steps" --precision "$precision" --rows "precision=more:$t.twin.h5" \
          --same-loss "$t.plain.h5"
      fi
    done
    p=$(median "${plain[@]}") t=$(median "${twin[@]}") f=$(median "${f64[@]}")
    awk -v s="$sample" -v q="$precision" -v p="$p" -v t="$t" -v f="$f" \
      'BEGIN { printf "| %s | %s | %.2f | %.2f | %.2fx | %.2f | %.2fx |\n", s, q, p, t, t / p, f, f / p }'
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
