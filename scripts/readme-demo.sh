#!/usr/bin/env bash
# Runs README.md's first command (the demo) as CI sees it: the first ```sh block, with the set-up step
# dropped (the build already exists) and build/ replaced by the build folder under test. So the command
# a user copies from the README is the command CI runs. Then the report and diff of the two traces.
#   scripts/readme-demo.sh BUILD_DIR WORK_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?build folder}
work=${2:?folder for the demo files}
fence='```sh'
command=$(awk -v fence="$fence" '$0 == fence {getline; print; exit}' "$root/README.md")
if [[ "$command" != "scripts/setup.sh && "* ]]; then
  echo "readme-demo: README's first command does not start with 'scripts/setup.sh && ': $command" >&2
  exit 1
fi
run=${command#scripts/setup.sh && }
run=${run//build\//$build/}
mkdir -p "$work"
cd "$work"
echo "readme-demo: $run"
eval "$run"
for f in demo-fp16.h5 demo-fp32.h5; do
  [[ -s "$f" ]] || { echo "readme-demo: $f was not written" >&2; exit 1; }
done
# The README's next commands: the fp16 run has anomalies (exit 1), the fp32 run none (exit 0), and the
# two runs part (exit 1).
expect_status() {
  local want=$1; shift
  local got=0
  "$@" > /dev/null || got=$?
  [[ $got == "$want" ]] || { echo "readme-demo: '$*' exited $got, expected $want" >&2; exit 1; }
}
expect_status 1 "$build/bin/ampscope" report demo-fp16.h5
expect_status 0 "$build/bin/ampscope" report demo-fp32.h5
expect_status 1 "$build/bin/ampscope" diff demo-fp32.h5 demo-fp16.h5
# fix: the f16 overflow of the attention scores is gone in f32 and bf16 (range 3.4e38), so a remedy is
# verified (exit 0) and the report marks it.
expect_status 0 "$build/bin/ampscope" fix demo-fp16.h5
marked=$("$build/bin/ampscope" report demo-fp16.h5 || true)  # exit 1: it has anomalies
[[ $marked == *'verified by `ampscope fix`'* ]] ||
  { echo "readme-demo: the report does not mark the remedies fix verified" >&2; exit 1; }
echo "readme-demo: report, diff and fix gave the expected exit statuses"
