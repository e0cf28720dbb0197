#!/usr/bin/env bash
# `ampscope` without a command, with an unknown one, a typo of one, or `view`: exit 2 and a message naming the
# commands, with a "did you mean" or the viewer's own program.
#   tests/cli/command_errors_test.sh AMPSCOPE_BINARY
set -uo pipefail
bin=${1:?usage: command_errors_test.sh AMPSCOPE_BINARY}
failures=0
commands="demo, train, report, diff, export, fix, record"
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
# A known command still parses as before.
"$bin" report --help >/dev/null 2>&1 || { echo "FAIL: ampscope report --help exited $?"; failures=$((failures + 1)); }
[ "$failures" -eq 0 ] && echo "command_errors: all passed"
exit $((failures > 0))
