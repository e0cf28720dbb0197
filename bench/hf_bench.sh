#!/usr/bin/env bash
# issue 18's benchmark in one go: a GPT-2-small folder (124M parameters) written once, then load time, step
# time and peak memory of ampscope (f32, fp16 and bf16 autocast) and of PyTorch (f32, bf16 autocast) on it,
# each phase in its own process. Usage: bench/hf_bench.sh [BUILD_DIR] [STEPS]   (defaults: build, 5)
# The premise, checked after timing (exits 1 with "hf_bench: premise broken: expected X, found Y"): both sides loaded
# the model written (the parameter count of the write line, ampscope's load line and PyTorch's), every step phase
# timed STEPS steps ("median of STEPS"), and each side's own check passed (every step ran, every loss finite).
set -euo pipefail
build=${1:-build}
steps=${2:-5}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
log="$dir/log"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F)"
"$build/bench/hf_bench" write "$dir" | tee -a "$log"
for phase in load fp32 fp16 bf16; do "$build/bench/hf_bench" "$phase" "$dir" "$steps" | tee -a "$log"; done
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  for phase in load f32 bf16; do /usr/bin/python3 "$(dirname "$0")/hf_pytorch_bench.py" "$phase" "$dir" "$steps" | tee -a "$log"; done
else
  echo "PyTorch (Debian's python3-torch) is not installed: its side is skipped"
fi
broken() { echo "hf_bench: premise broken: expected $1, found $2" >&2; exit 1; }
written=$(sed -nE 's/^write: .*\(([0-9]+) parameters\).*/\1/p' "$log")
loaded=$(sed -nE 's/^load: .*\(([0-9]+) parameters\).*/\1/p' "$log" | sort -u | tr '\n' ' ')
[[ -n $written && $loaded == "$written " ]] || broken "every load of the $written parameters written" "'$loaded'"
step_lines=$(grep -E '^(torch )?[a-z0-9]+: step ' "$log" || true)
(($(grep -c . <<<"$step_lines") >= 3)) || broken "the step lines of fp32, fp16 and bf16" "'$step_lines'"
while read -r line; do
  [[ $line == *"(median of $steps;"* ]] || broken "$steps steps timed" "'$line'"
done <<<"$step_lines"
