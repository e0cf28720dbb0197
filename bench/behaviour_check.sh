#!/usr/bin/env bash
# bench/behaviour_check.sh: a restructure (files moved, code reorganised) must change no behaviour. Runs two
# builds of `ampscope` side by side on a dozen configurations and compares everything they write, field by
# field, wall times aside:
#
#   bench/behaviour_check.sh OLD_BIN NEW_BIN [WORK_DIR]   # each an `ampscope` executable
#
# Each binary works in a folder of its own (old/, new/) with the same relative names, so that every path a
# program records (the config's `out` and `--model`, the report's `path`) is the same text on both sides. Per
# configuration and binary:
#   ampscope train ... --device cpu --out NAME.h5   exit status, stdout, stderr
#   ampscope export NAME.h5 --csv NAME.csv          every table as CSV (doubles in their shortest round-trip text,
#                                                   so equal text is equal bits; run.csv holds the root attributes,
#                                                   config and probe JSON included), stdout, stderr, exit status
#   ampscope report NAME.h5 --json                  stdout, stderr, exit status
#   /usr/bin/python3 + h5py                         every root attribute (attributes_crc32 too) and each dataset's
#                                                   type, shape, chunks, filters and attributes
# and for pairs `ampscope diff A.h5 B.h5 --json` (stdout, stderr, exit status). All of it is compared old
# against new byte for byte (JSON one value per line, numbers as written), except these time fields:
#   steps.csv `time_ms`   the wall time of each step (docs/trace-format.md, /steps): left out.
#   train's stdout        its progress lines' "N steps/s  Ts left": masked (the rest of each line is compared).
# Evidence that nothing else varies: every configuration below run twice with one binary (OLD = NEW, outputs
# kept): of all the CSV files, only steps.csv differed, and in it only `time_ms` (every configuration); the
# report and diff JSON, the exit statuses, stderr and every HDF5 attribute (config included) were byte for
# byte equal, and train's stdout differed only in steps/s. The report and diff JSON hold no time field
# (docs/report-format.md), so nothing is left out of them.
#
# Configurations: the samples (mlp fp32 and fp16, cnn bf16 at --probe full, transformer fp32 and fp16 with
# --twin), three scenarios (attention-overflow, scale-collapse: the GradScaler backing off every step, log-zero),
# a tiny GPT-2 (fp16) and a tiny T5 (bf16) folder (--model; config.json + model.safetensors, written once by
# bench/behaviour_check.py, seeded, shared by both binaries, with a --tokens file), and the rank-bad-batch
# scenario with --ddp at 2 ranks under `mpirun --oversubscribe -np 2` (each rank's trace, the multi-rank report
# and the diff of the two ranks; skipped with a note without mpirun); diffs: mlp fp32 against fp16, and
# scale-collapse against its healthy run (mlp fp16).
#
# Threads: AMPSCOPE_NUM_THREADS is set for both binaries (default 2; 1 per rank under mpirun), so both split the
# CPU kernels' work the same way on any machine (here 1 and 2 threads gave the same rows). Prints one line per
# configuration ("same: N files, M rows", or what differs with a short diff) and exits 1 if anything differs
# or a run failed (2 on a usage error). Both builds run on this machine, one after the other; the whole check
# took about 20 s here (2 cores). Without WORK_DIR everything goes to a temporary folder removed at the end;
# with it, the outputs stay there (WORK_DIR/old, WORK_DIR/new; what is compared under */cmp/). No CI job or
# ctest runs this script: it needs two builds.
set -euo pipefail

usage="usage: bench/behaviour_check.sh OLD_BIN NEW_BIN [WORK_DIR]"
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "$usage" >&2; exit 2; }
for b in "$1" "$2"; do
  [ -x "$b" ] && [ -f "$b" ] || { echo "behaviour_check: $b is not an executable file"$'\n'"$usage" >&2; exit 2; }
done
old_bin=$(realpath "$1")
new_bin=$(realpath "$2")
helper="$(cd "$(dirname "$0")" && pwd)/behaviour_check.py"
py=/usr/bin/python3  # Debian's, with numpy and h5py (the python3 on PATH may be another)

if [ $# -eq 3 ]; then
  work=$(realpath -m "$3")
  rm -rf "$work/old" "$work/new" "$work/shared"
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work/old" "$work/new" "$work/shared"

export AMPSCOPE_NUM_THREADS=${AMPSCOPE_NUM_THREADS:-2}
export NO_COLOR=1
mpi_env=(env)
[ "$(id -u)" -eq 0 ] && mpi_env=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)

# The model folders and the token file, once, for both binaries (relative to old/ and new/: ../shared).
"$py" "$helper" models "$work/shared"

status=0

# collect SIDE TRACE CMP: the export, report and attributes of one trace, into the folder CMP.
collect() {
  local side=$1 trace=$2 cmp=$3 bin rc
  bin=$([ "$side" = old ] && echo "$old_bin" || echo "$new_bin")
  mkdir -p "$cmp"
  rc=0; "$bin" export "$trace" --csv "${trace%.h5}.csv" >"$cmp/export.out" 2>"$cmp/export.err" || rc=$?
  echo "$rc" >"$cmp/export.rc"
  "$py" "$helper" csv "${trace%.h5}.csv" "$cmp/csv" >"$cmp/rows"
  rc=0; "$bin" report "$trace" --json >"${trace%.h5}.report.json" 2>"$cmp/report.err" || rc=$?
  echo "$rc" >"$cmp/report.rc"
  "$py" "$helper" json "${trace%.h5}.report.json" "$cmp/report.json"
  "$py" "$helper" h5meta "$trace" >"$cmp/attributes.txt"
}

# train_output SIDE NAME RC: train's exit status, stdout (the progress lines' steps/s and time left masked) and
# stderr, into cmp/NAME.
train_output() {
  local cmp="$work/$1/cmp/$2"
  echo "$3" >"$cmp/train.rc"
  tr '\r' '\n' <"$work/$1/$2.train.out" |  # under mpirun, stdout is a terminal: lines rewritten in place
    sed -E '/^ *$/d; s/ +$//; s|  [0-9.]+ steps/s  [^ ]+ left$|  (steps/s, time left)|' >"$cmp/train.out"
  cp "$work/$1/$2.train.err" "$cmp/train.err"
}

# train SIDE NAME ARGS...: trains NAME.h5 in SIDE's folder; its exit status goes to cmp/NAME/train.rc.
train() {
  local side=$1 name=$2 bin rc=0
  shift 2
  bin=$([ "$side" = old ] && echo "$old_bin" || echo "$new_bin")
  mkdir -p "$work/$side/cmp/$name"
  (cd "$work/$side" && "$bin" train "$@" --device cpu --out "$name.h5" >"$name.train.out" 2>"$name.train.err") || rc=$?
  train_output "$side" "$name" "$rc"
  [ "$rc" -eq 0 ] || return 0
  (cd "$work/$side" && collect "$side" "$name.h5" "cmp/$name")
}

# compare NAME: old/cmp/NAME against new/cmp/NAME; one line, and a short diff when they differ.
compare() {
  local name=$1 files rows
  files=$(find "$work/old/cmp/$name" -type f ! -name rows | wc -l)
  rows=$(find "$work/old/cmp/$name" -name rows -exec cat {} + | awk '{ s += $1 } END { print s + 0 }')
  if grep -qvx 0 "$work"/{old,new}/cmp/"$name"/train.rc 2>/dev/null; then
    echo "$name: FAILED: train exited $(cat "$work/old/cmp/$name/train.rc") (old), $(cat "$work/new/cmp/$name/train.rc") (new):"
    for side in old new; do tail -n 3 "$work/$side/$name.train.err" | sed "s/^/  $side: /"; done
    status=1
  elif diff -r -q "$work/old/cmp/$name" "$work/new/cmp/$name" >/dev/null; then
    echo "$name: same: $files files$([ "$rows" -gt 0 ] && echo ", $rows rows")"
  else
    echo "$name: DIFFERS:"
    diff -r -q "$work/old/cmp/$name" "$work/new/cmp/$name" | sed "s|$work/||g; s/^/  /" | head -n 20 || true
    diff -r "$work/old/cmp/$name" "$work/new/cmp/$name" | sed "s|$work/||g" | cut -c 1-200 | head -n 16 |
      sed 's/^/    /' || true
    status=1
  fi
}

# check NAME ARGS...: train and collect with both binaries, then compare.
check() {
  train old "$@"
  train new "$@"
  compare "$1"
}

# diff_pair A B: `ampscope diff A.h5 B.h5 --json` with each binary, compared.
diff_pair() {
  local a=$1 b=$2 name="diff-$1-$2" side bin rc
  if [ ! -f "$work/old/$a.h5" ] || [ ! -f "$work/new/$a.h5" ] || [ ! -f "$work/old/$b.h5" ] || [ ! -f "$work/new/$b.h5" ]; then
    echo "$name: FAILED: a trace is missing (its run failed above)"
    status=1
    return 0
  fi
  for side in old new; do
    bin=$([ "$side" = old ] && echo "$old_bin" || echo "$new_bin")
    mkdir -p "$work/$side/cmp/$name"
    rc=0; (cd "$work/$side" && "$bin" diff "$a.h5" "$b.h5" --json >"$name.json" 2>"cmp/$name/diff.err") || rc=$?
    echo "$rc" >"$work/$side/cmp/$name/diff.rc"
    "$py" "$helper" json "$work/$side/$name.json" "$work/$side/cmp/$name/diff.json"
  done
  compare "$name"
}

# ddp NAME ARGS...: ARGS --ddp at 2 ranks under mpirun: each rank's trace, the multi-rank report, the ranks' diff.
ddp() {
  local name=$1 side bin rc r
  shift
  if ! command -v mpirun >/dev/null; then
    echo "$name: skipped: mpirun not found"
    return 0
  fi
  for side in old new; do
    bin=$([ "$side" = old ] && echo "$old_bin" || echo "$new_bin")
    mkdir -p "$work/$side/cmp/$name"
    rc=0
    (cd "$work/$side" && "${mpi_env[@]}" AMPSCOPE_NUM_THREADS=1 mpirun --oversubscribe -np 2 -x AMPSCOPE_NUM_THREADS \
       "$bin" train "$@" --ddp --device cpu --out "$name.h5" >"$name.train.out" 2>"$name.train.err") || rc=$?
    train_output "$side" "$name" "$rc"
    [ "$rc" -eq 0 ] || continue
    for r in 0 1; do
      (cd "$work/$side" && collect "$side" "$name.rank$r.h5" "cmp/$name/rank$r")
    done
    rc=0; (cd "$work/$side" && "$bin" report "$name.h5" --json >"$name.report.json" 2>"cmp/$name/report.err") || rc=$?
    echo "$rc" >"$work/$side/cmp/$name/report.rc"
    "$py" "$helper" json "$work/$side/$name.report.json" "$work/$side/cmp/$name/report.json"
    rc=0; (cd "$work/$side" && "$bin" diff "$name.rank0.h5" "$name.rank1.h5" --json >"$name.ranks.json" 2>"cmp/$name/ranks-diff.err") || rc=$?
    echo "$rc" >"$work/$side/cmp/$name/ranks-diff.rc"
    "$py" "$helper" json "$work/$side/$name.ranks.json" "$work/$side/cmp/$name/ranks-diff.json"
  done
  compare "$name"
}

models=(--tokens ../shared/tokens.txt --context 16 --batch 2 --lr 1e-3 --steps 4)

check mlp-fp32 --sample mlp --precision fp32 --steps 8
check mlp-fp16 --sample mlp --precision fp16 --steps 8
check cnn-bf16-full --sample cnn --precision bf16 --steps 4 --probe full
check transformer-fp32 --sample transformer --precision fp32 --steps 4
check transformer-fp16-twin --sample transformer --precision fp16 --steps 4 --twin
check attention-overflow --scenario attention-overflow --steps 6
check scale-collapse --scenario scale-collapse --steps 8
check log-zero --scenario log-zero --steps 6
check gpt2-fp16 --model ../shared/gpt2 "${models[@]}" --precision fp16
check t5-bf16 --model ../shared/t5 "${models[@]}" --precision bf16
ddp ddp-rank-bad-batch --scenario rank-bad-batch --precision fp16 --batch 64 --steps 6
diff_pair mlp-fp32 mlp-fp16
diff_pair mlp-fp16 scale-collapse

[ "$status" -eq 0 ] && echo "behaviour_check: no difference" || echo "behaviour_check: DIFFERENCES (or failed runs) above"
[ $# -eq 3 ] && echo "outputs kept in $work"
exit "$status"
