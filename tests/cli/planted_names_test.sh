#!/usr/bin/env bash
# Names planted beside a run's outputs (issue 36), through the binary: a symbolic link at --out, at
# "<out>.lock" or at --save-model's model.safetensors is refused with exit 2 and a message naming it, and the
# file it points at (outside the folder) keeps its bytes; --overwrite replaces the links themselves. A hard
# link planted at the name the weights' writer used for its temporary file ("model.safetensors.tmp") is not
# written through either. A FIFO at "<trace>.lock" does not block `ampscope report` (timeout 30 s), nor a FIFO
# or JSON nested 10^6 levels deep as the results file beside the trace. And every input slot of the command
# line (--config, --resume, --text, --data's IDX files, the trace of report, diff, fix and export) given a FIFO
# or a link to /dev/zero: exit 2 within 30 s, naming what it is.
#   tests/cli/planted_names_test.sh AMPSCOPE_BINARY SCRATCH_DIR
set -uo pipefail
bin=$(realpath "${1:?usage: planted_names_test.sh AMPSCOPE_BINARY SCRATCH_DIR}")
scratch=${2:?usage: planted_names_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
rm -rf "$scratch" && mkdir -p "$scratch/run" "$scratch/elsewhere" || exit 1
cd "$scratch" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
victim=elsewhere/victim
precious="precious bytes, not a trace"
fresh_victim() { printf '%s\n' "$precious" > "$victim"; rm -rf run && mkdir run; }
victim_intact() {  # victim_intact CASE
  if [ "$(cat "$victim")" = "$precious" ]; then ok "$1: the file outside keeps its bytes"; else fail "$1: the file outside was written: $(head -c 80 "$victim" | od -c | head -2)"; fi
}
expect_refusal() {  # expect_refusal CASE EXPECTED_SUBSTRING -- ARGS...
  local name=$1 expected=$2 out rc; shift 3
  out=$(timeout 120 "$bin" "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" != 2 ]; then fail "$name: exit $rc (expected 2): $out"
  elif [[ "$out" != *"$expected"* ]]; then fail "$name: the message lacks '$expected': $out"
  else ok "$name: refused: ${out%%$'\n'*}"; fi
}
train=(train --sample mlp --steps 2 --device cpu)

# A link at --out: refused, without and with a lock file beside it.
fresh_victim; ln -s ../$victim run/t.h5
expect_refusal "link at --out" "--out: 'run/t.h5' is a symbolic link (to '../elsewhere/victim'); ampscope never writes a trace through a link" -- "${train[@]}" --out run/t.h5
victim_intact "link at --out"
# --overwrite replaces the link's name: a trace there, the file outside untouched.
timeout 120 "$bin" "${train[@]}" --out run/t.h5 --overwrite >/dev/null 2>&1 || fail "--overwrite over a link at --out: exit $?"
[ -f run/t.h5 ] && [ ! -L run/t.h5 ] && ok "--overwrite replaced the link at --out by a trace" || fail "--overwrite: run/t.h5 is not a trace file"
victim_intact "--overwrite over a link at --out"

# A link at <out>.lock: the writer used to open it (following the link) and empty it.
fresh_victim; ln -s ../$victim run/t.h5.lock
expect_refusal "link at the lock file" "cannot write trace 'run/t.h5': its lock file 'run/t.h5.lock' is a symbolic link (to '../elsewhere/victim'); a trace writer never writes through a link" -- "${train[@]}" --out run/t.h5
victim_intact "link at the lock file"
[ ! -e run/t.h5 ] && ok "no trace written beside a planted lock link" || fail "a trace was written beside a planted lock link"
timeout 120 "$bin" "${train[@]}" --out run/t.h5 --overwrite >/dev/null 2>&1 || fail "--overwrite over a link at the lock file: exit $?"
[ -f run/t.h5 ] && [ ! -e run/t.h5.lock ] && ok "--overwrite removed the lock link and wrote the trace" || fail "--overwrite with a lock link: $(ls -l run)"
victim_intact "--overwrite over a link at the lock file"

# A FIFO at <out>.lock: refused by the writer, never opened (a FIFO opened for writing has no reader).
fresh_victim; mkfifo run/t.h5.lock
expect_refusal "FIFO at the lock file" "its lock file 'run/t.h5.lock' exists and is a FIFO (named pipe), not a regular file" -- "${train[@]}" --out run/t.h5

# A FIFO at <trace>.lock beside a finished trace: report reads the trace and does not block on the FIFO.
fresh_victim
timeout 120 "$bin" "${train[@]}" --out run/t.h5 >/dev/null 2>&1 || fail "training run/t.h5: exit $?"
mkfifo run/t.h5.lock
out=$(timeout 30 "$bin" report --json run/t.h5 2>&1); rc=$?
if [ "$rc" = 124 ]; then fail "report with a FIFO at the lock file blocked (killed after 30 s)"
elif [ "$rc" != 0 ] || [[ "$out" != *'"kind": "report"'* ]]; then fail "report with a FIFO at the lock file: exit $rc: ${out:0:300}"
else ok "report with a FIFO at the lock file finished (exit 0)"; fi
# A link to a device there: not opened either (lstat first), and the report still finishes.
rm -f run/t.h5.lock && ln -s /dev/zero run/t.h5.lock
out=$(timeout 30 "$bin" report --json run/t.h5 2>&1); rc=$?
[ "$rc" = 0 ] && ok "report with a link to /dev/zero at the lock file finished" || fail "report with /dev/zero at the lock file: exit $rc: ${out:0:300}"

# The results file `fix` leaves beside a trace (<stem>.fix.json), which report reads: JSON nested 10^6 levels
# deep (closed, and never closed) is ignored with a note, a FIFO there is not opened; report finishes.
rm -f run/t.h5.lock
deep=$(printf '%*s' 1000000 '' | tr ' ' '[')
printf '%s%s\n' "$deep" "$(printf '%*s' 1000000 '' | tr ' ' ']')" > run/t.fix.json
out=$(timeout 30 "$bin" report run/t.h5 2>&1 >/dev/null); rc=$?
[ "$rc" = 0 ] && [[ "$out" == *"NOTE: ignoring 'run/t.fix.json': it is not JSON"* ]] \
  && ok "report beside a results file nested 10^6 deep: a note" || fail "report beside a deep results file: exit $rc: ${out:0:300}"
printf '{"runs":%s' "$deep" > run/t.fix.json
out=$(timeout 30 "$bin" report run/t.h5 2>&1 >/dev/null); rc=$?
[ "$rc" = 0 ] && [[ "$out" == *"NOTE: ignoring 'run/t.fix.json'"* ]] \
  && ok "report beside an unclosed results file nested 10^6 deep: a note" || fail "report beside an unclosed deep results file: exit $rc: ${out:0:300}"
rm -f run/t.fix.json && mkfifo run/t.fix.json
out=$(timeout 30 "$bin" report run/t.h5 2>&1 >/dev/null); rc=$?
[ "$rc" = 0 ] && ok "report beside a FIFO as the results file finished" || fail "report beside a FIFO results file: exit $rc: ${out:0:300}"

# --save-model: a link at model.safetensors is refused before the run; the file outside keeps its bytes.
fresh_victim; ln -s ../$victim run/model.safetensors
expect_refusal "link at --save-model's model.safetensors" "--save-model's model.safetensors '$scratch/run/model.safetensors' is a symbolic link (to '../elsewhere/victim'); ampscope never writes through a link" -- "${train[@]}" --save-model run
victim_intact "link at model.safetensors"
# A hard link at model.safetensors.tmp (the writer's temporary name until this change, opened with O_TRUNC):
# the weights go to a fresh name of their own; the linked file keeps its bytes.
fresh_victim; ln "$victim" run/model.safetensors.tmp
timeout 120 "$bin" "${train[@]}" --save-model run >/dev/null 2>&1 || fail "--save-model beside a planted .tmp: exit $?"
victim_intact "hard link at model.safetensors.tmp"
[ -f run/model.safetensors ] && [ "$(head -c 8 run/model.safetensors | od -An -tu8 | tr -d ' ')" -gt 0 ] \
  && ok "--save-model wrote run/model.safetensors" || fail "--save-model: no weights written"

# Every input slot of the command line given a FIFO or a link to /dev/zero: exit 2 within 30 s, naming what it
# is (a FIFO opened for reading would block; /dev/zero would be read until memory runs out).
rm -rf slots && mkdir -p slots/mnist && mkfifo slots/fifo && ln -s /dev/zero slots/zero
slot() {  # slot NAME EXPECTED -- ARGS...
  local name=$1 expected=$2 out rc; shift 3
  out=$(timeout 30 "$bin" "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" = 124 ]; then fail "$name: blocked (killed after 30 s)"
  elif [ "$rc" != 2 ] || [[ "$out" != *"$expected"* ]]; then fail "$name: exit $rc, expected 2 and '$expected': ${out:0:300}"
  else ok "$name: ${out%%$'\n'*}"; fi
}
for kind in fifo zero; do
  what=$([ $kind = fifo ] && echo "a FIFO (named pipe)" || echo "a character device")
  slot "--config $kind" "$what" -- train --config slots/$kind
  slot "--resume $kind" "$what" -- train --sample mlp --steps 1 --device cpu --resume slots/$kind
  slot "--text $kind" "$what" -- train --sample transformer --steps 1 --device cpu --text slots/$kind
  rm -f slots/mnist/train-images-idx3-ubyte
  if [ $kind = fifo ]; then mkfifo slots/mnist/train-images-idx3-ubyte; else ln -s /dev/zero slots/mnist/train-images-idx3-ubyte; fi
  slot "--data with a $kind as the images" "$what" -- train --sample cnn --steps 1 --device cpu --data slots/mnist
  slot "report $kind" "$what" -- report slots/$kind
  slot "diff $kind" "$what" -- diff slots/$kind slots/$kind
  slot "fix $kind" "$what" -- fix slots/$kind
  slot "export $kind" "$what" -- export slots/$kind --csv slots/csv
done

echo "$failures failure(s)"
[ "$failures" = 0 ]
