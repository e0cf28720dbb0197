#!/usr/bin/env bash
# `ampscope` without a command, with an unknown one, a typo of one, or `view`: exit 2 and a message naming the
# commands, with a "did you mean" or the viewer's own program.
#   tests/cli/command_errors_test.sh AMPSCOPE_BINARY
set -uo pipefail
bin=${1:?usage: command_errors_test.sh AMPSCOPE_BINARY}
failures=0
commands="demo, train, report, diff, export, fix, record, tokenize"
expect() {  # expect "ARGS" STATUS "EXPECTED STDERR"
  local args=$1 status=$2 expected=$3 out rc
  out=$("$bin" $args 2>&1 >/dev/null); rc=$?
  if [ "$rc" != "$status" ] || [ "$out" != "$expected" ]; then
    echo "FAIL: ampscope $args: exit $rc (expected $status)"; echo "  got:      $out"; echo "  expected: $expected"
    failures=$((failures + 1))
  else
    echo "ok: ampscope $args"
  fi
}
expect "" 2 "ampscope: error: no command given; the commands are $commands
hint: ampscope train --help, or ampscope --help for every command"
expect "--verbose" 2 "ampscope: error: no command given; the commands are $commands
hint: ampscope train --help, or ampscope --help for every command"
expect "view run.h5" 2 "ampscope: error: unknown command 'view'; the commands are $commands
hint: the viewer is a program of its own: ampscope-view TRACE.h5 [TRACE2.h5]"
expect "frobnicate" 2 "ampscope: error: unknown command 'frobnicate'; the commands are $commands
hint: ampscope --help describes each command"
expect "repot run.h5" 2 "ampscope: error: unknown command 'repot'; the commands are $commands
hint: did you mean 'ampscope report'?"
expect "--verbose tarin" 2 "ampscope: error: unknown command 'tarin'; the commands are $commands
hint: did you mean 'ampscope train'?"
# CLI11's parse errors in ampscope's voice: the prefix, the command, "did you mean", what the value should be.
expect "train --step 10" 2 "ampscope: error: ampscope train: unknown option '--step'; did you mean '--steps'?
hint: ampscope train --help lists its options"
expect "report --jsn run.h5" 2 "ampscope: error: ampscope report: unknown option '--jsn'; did you mean '--json'?
hint: ampscope report --help lists its options"
expect "train --steps 1.5" 2 "ampscope: error: ampscope train: --steps: '1.5' is not a whole number
hint: ampscope train --help lists its options"
expect "train --lr abc" 2 "ampscope: error: ampscope train: --lr: 'abc' is not a number
hint: ampscope train --help lists its options"
expect "diff a.h5" 2 "ampscope: error: ampscope diff: needs two traces, a and b: ampscope diff A.h5 B.h5 (the first is the reference)
hint: ampscope diff --help lists its options"
expect "report" 2 "ampscope: error: ampscope report: the trace argument is missing
hint: ampscope report --help lists its options"
# A trace named without its .h5: the file that is there is named.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
touch "$work/demo-fp16.h5"
expect "report $work/demo-fp16" 2 "ampscope report: error: cannot read trace '$work/demo-fp16': no such file
hint: did you mean '$work/demo-fp16.h5'?"
# Progress without a terminal (a log, mpirun): about 20 lines a run and the first skipped step, not one line a
# step although every step is skipped; steps counted from 0 as report and diff count them; "1 step".
"$bin" train --sample transformer --scenario attention-overflow --steps 60 --device cpu >"$work/log" 2>&1 || true
lines=$(grep -c ' step [0-9]* ([0-9]*/60 done)' "$work/log")
if [ "$lines" -gt 22 ] || [ "$lines" -lt 2 ]; then
  echo "FAIL: $lines progress lines for 60 skipped steps (expected 2 to 22)"; failures=$((failures + 1))
else
  echo "ok: $lines progress lines for 60 steps"
fi
grep -q 'step 59 (60/60 done)' "$work/log" || { echo "FAIL: no last progress line 'step 59 (60/60 done)'"; failures=$((failures + 1)); }
grep -q 'step 0 (1/60 done)' "$work/log" || { echo "FAIL: the first skipped step (step 0) is not shown"; failures=$((failures + 1)); }
"$bin" train --sample mlp --steps 1 --device cpu >"$work/one" 2>&1
grep -q "summary: 1 step of 'mlp'" "$work/one" || { echo "FAIL: the summary of one step:"; cat "$work/one"; failures=$((failures + 1)); }
# A known command still parses as before.
"$bin" report --help >/dev/null 2>&1 || { echo "FAIL: ampscope report --help exited $?"; failures=$((failures + 1)); }
# Help that tells the truth (issue 31): --model takes Mistral and T5 folders too, and --text instead of
# --tokens; `ampscope tokenize --help` names its options. Help text may be wrapped: compare with spaces
# squeezed.
help_has() {  # help_has "ARGS" "TEXT" [absent]
  local text
  text=$("$bin" $1 --help 2>&1 | tr -s " \n" "  ")
  if [ "${3:-}" = absent ]; then
    if grep -qF -- "$2" <<<"$text"; then echo "FAIL: ampscope $1 --help still says '$2'"; failures=$((failures + 1)); fi
  elif ! grep -qF -- "$2" <<<"$text"; then
    echo "FAIL: ampscope $1 --help lacks '$2'"; failures=$((failures + 1))
  else
    echo "ok: ampscope $1 --help says '$2'"
  fi
}
help_has train "config.json (model_type gpt2, llama, mistral or t5)"
help_has train "its data: --tokens, or --text when the folder has GPT-2's byte-level BPE tokenizer"
help_has train "needs --tokens" absent
help_has train "gpt2 or llama" absent
help_has tokenize "--model"
help_has tokenize "Write the ids to this token file instead of printing them"
help_has tokenize "Replace the --tokens file if it exists"
expect "tokenize notes.txt" 2 "ampscope: error: ampscope tokenize: the --model argument is missing
hint: ampscope tokenize --help lists its options"
[ "$failures" -eq 0 ] && echo "command_errors: all passed"
exit $((failures > 0))
