#!/usr/bin/env bash
# bench/twin_train_bench.sh: the f32 twin's cost in real runs: `ampscope train` per sample (mlp, cnn,
# transformer) in fp16 at probe level health, without the twin, with --twin (every step, forward ops and
# backward nodes), with --twin-forward-only (every step, forward ops only) and with --twin-every 5, the four
# runs of a sample alternated ROUNDS times so they see the same machine load.
# A step's time is the /steps field time_ms (forward, backward, unscale, clip, optimizer step and the probe's
# and twin's work in them); each run gives the median over its steps after the first two (warm-up), each
# configuration the median over its rounds, and the ratios are twin / plain, forward-only / plain and
# every-5 / plain.
# The premise, checked on every run's trace after a sample's rounds (bench/premise.py; exits 1 with "premise
# broken"): each run is complete with STEPS steps in fp16; the plain run has no /precision rows, --twin the same
# number in every step, forward and backward, --twin-forward-only forward rows only, --twin-every 5 rows only in
# steps 0, 5, 10, ...; every run's losses equal the plain run's bit for bit (the twin only watches the run).
# Results: bench/RESULTS.md.
#
#   bench/twin_train_bench.sh build [STEPS] [ROUNDS]     # build: the build folder holding bin/ampscope
set -euo pipefail

build=${1:?usage: bench/twin_train_bench.sh BUILD_DIR [STEPS] [ROUNDS]}
steps=${2:-12}
rounds=${3:-2}
ampscope="$build/bin/ampscope"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# step_ms, median
source "$(dirname "${BASH_SOURCE[0]}")/step_times.sh"

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| sample | plain ms/step | --twin ms/step | ratio | --twin-forward-only ms/step | ratio | --twin-every 5 ms/step | ratio |"
echo "|---|---|---|---|---|---|---|---|"
for sample in mlp cnn transformer; do
  plain=() twin=() forward=() every=()
  for ((r = 0; r < rounds; ++r)); do
    for mode in plain twin forward every; do
      case $mode in
        plain) extra=() ;;
        twin) extra=(--twin) ;;
        forward) extra=(--twin-forward-only) ;;
        every) extra=(--twin-every 5) ;;
      esac
      "$ampscope" train --overwrite --sample "$sample" --precision fp16 --device cpu --steps "$steps" --probe health \
        --out "$work/$sample.$r.$mode.h5" "${extra[@]}" >/dev/null
      ms=$(step_ms "$work/$sample.$r.$mode.h5")
      case $mode in
        plain) plain+=("$ms") ;;
        twin) twin+=("$ms") ;;
        forward) forward+=("$ms") ;;
        every) every+=("$ms") ;;
      esac
    done
  done
  for ((r = 0; r < rounds; ++r)); do
    t="$work/$sample.$r"
    premise twin_train_bench "$t.plain.h5" --steps "$steps" --precision fp16 --rows precision=none
    premise twin_train_bench "$t.twin.h5" --steps "$steps" --precision fp16 --rows precision=same \
      --rows precision.forward=every --rows precision.backward=every --same-loss "$t.plain.h5"
    premise twin_train_bench "$t.forward.h5" --steps "$steps" --precision fp16 --rows precision=same \
      --rows precision.backward=none --same-loss "$t.plain.h5"
    premise twin_train_bench "$t.every.h5" --steps "$steps" --precision fp16 --rows precision=mod:5 --same-loss "$t.plain.h5"
  done
  p=$(median "${plain[@]}") t=$(median "${twin[@]}") f=$(median "${forward[@]}") e=$(median "${every[@]}")
  awk -v s="$sample" -v p="$p" -v t="$t" -v f="$f" -v e="$e" \
    'BEGIN { printf "| %s | %.2f | %.2f | %.2fx | %.2f | %.2fx | %.2f | %.2fx |\n", s, p, t, t / p, f, f / p, e, e / p }'
done
