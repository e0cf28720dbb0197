#!/usr/bin/env bash
# bench/twin_rows_check.sh: a change meant to make the f32 twin faster must not change one of its numbers.
# Trains each sample (mlp, cnn, transformer) in fp16 with --twin, once with each of two builds, exports both
# traces' /precision tables as CSV (each double in the shortest text that reads back to its bits, so equal text
# is equal values) and compares them byte for byte. Both builds run on this machine with the same thread count:
# the run itself, and so the twin's rows, depend on the CPU's BLAS kernels and on how work is split over threads.
# The premise, checked before comparing (bench/premise.py; exits 1 with "premise broken"): each trace is complete
# with STEPS steps in fp16 and has the same number of /precision rows, at least one, in every step (both builds
# really twinned: two empty tables would compare equal).
#
#   bench/twin_rows_check.sh OLD_BUILD NEW_BUILD [STEPS]   # each build folder holding bin/ampscope
set -euo pipefail

old=${1:?usage: bench/twin_rows_check.sh OLD_BUILD NEW_BUILD [STEPS]}
new=${2:?usage: bench/twin_rows_check.sh OLD_BUILD NEW_BUILD [STEPS]}
steps=${3:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

status=0
for sample in mlp cnn transformer; do
  for side in old new; do
    bin="${!side}/bin/ampscope"
    "$bin" train --sample "$sample" --precision fp16 --device cpu --steps "$steps" --probe health --twin \
      --out "$work/$side-$sample.h5" >/dev/null
    "$bin" export "$work/$side-$sample.h5" --csv "$work/$side-$sample" >/dev/null
    /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/premise.py" twin_rows_check "$work/$side-$sample.h5" --steps "$steps" \
      --precision fp16 --rows precision=same || exit 1
  done
  rows=$(($(wc -l <"$work/new-$sample/precision.csv") - 1))
  if cmp -s "$work/old-$sample/precision.csv" "$work/new-$sample/precision.csv"; then
    echo "$sample: the same $rows /precision rows, every field"
  else
    echo "$sample: /precision rows differ:"
    diff "$work/old-$sample/precision.csv" "$work/new-$sample/precision.csv" | head -n 10
    status=1
  fi
done
exit $status
