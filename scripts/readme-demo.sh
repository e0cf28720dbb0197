#!/usr/bin/env bash
# Runs README.md's first command (the demo) as CI sees it: the first ```sh block, with the set-up step
# dropped (the build already exists) and build/ replaced by the build folder under test. So the command
# a user copies from the README is the command CI runs.
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
