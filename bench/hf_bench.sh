#!/usr/bin/env bash
# issue 18's benchmark in one go: a GPT-2-small folder (124M parameters) written once, then load time, step
# time and peak memory of ampscope (f32, fp16 and bf16 autocast) and of PyTorch (f32, bf16 autocast) on it,
# each phase in its own process. Usage: bench/hf_bench.sh [BUILD_DIR] [STEPS]   (defaults: build, 5)
set -euo pipefail
build=${1:-build}
steps=${2:-5}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F)"
"$build/bench/hf_bench" write "$dir"
for phase in load fp32 fp16 bf16; do "$build/bench/hf_bench" "$phase" "$dir" "$steps"; done
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  for phase in load f32 bf16; do /usr/bin/python3 "$(dirname "$0")/hf_pytorch_bench.py" "$phase" "$dir" "$steps"; done
else
  echo "PyTorch (Debian's python3-torch) is not installed: its side is skipped"
fi
