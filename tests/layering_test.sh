#!/usr/bin/env bash
# tests/layering_test.sh: the direction of dependencies (docs/architecture.md) as a check. Every project
# include ("core/...", "probes/...", ...) of every source and header in a folder must be one that folder may
# use; anything else fails, naming the file, the line and the rule.
#
#   tests/layering_test.sh [SOURCE_DIR]      # exit 0: every include allowed; 1: a violation (listed)
#
# The rules, one folder each (a folder's subfolders that have rules of their own are checked by those):
#   probes/trace/     the trace: itself, and core's header-only error types, HDF5 helpers and bounded JSON
#                     parsing (core/io/json_limits.h); no runtime, no CUDA
#   probes/analysis/  the diagnosis: itself, the trace, core's error types
#   viewer/           the trace, the analysis, core's error types: never the runtime or CUDA
#   models/           itself and core
#   samples/          itself, models and core (never the command line or the probes)
#   kernels/          itself and core's lowest headers (dtype, conversions (f16/bf16, FP8, the block-scaled elements), random stream, views, the backend
#                     interface, errors, the raw communicator)
#   core/             itself; the backends' headers only in backend_registry.cpp (the one place naming them)
#   probes/           the run-time probe: itself, core, the trace and the analysis; kernels only through
#                     kernels' public headers (never kernels/cpu or kernels/cuda internals)
set -euo pipefail
root=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$root"

# folder | allowed include pattern (an extended regex matched against the whole included path)
rules=(
  "probes/trace|probes/trace/.*|core/error\.h|core/io/hdf5_support\.h|core/io/json_limits\.h"
  "probes/analysis|probes/analysis/.*|probes/trace/.*|core/error\.h"
  "viewer|viewer/.*|probes/trace/.*|probes/analysis/.*|core/error\.h"
  "models|models/.*|core/.*"
  "samples|samples/.*|models/.*|core/.*"
  "kernels|kernels/.*|core/(backend|block_scaled_elements|convert|dtype|error|float16|float8|philox|tensor_view)\.h|core/distributed/communicator\.h"
  "core|core/.*"
  "probes|probes/.*|core/.*|kernels/[a-z_]+\.h"
)
# Exceptions, each with its reason: file | allowed include pattern
exceptions=(
  "core/backend_registry.cpp|kernels/(cpu/cpu|cuda/cuda)_backend\.h|kernels/cuda/fp8_cuda\.h"  # the one place that names the backends (and the CUDA FP8 kernels)
)

# The folder whose rule governs a file: the longest folder in the rules that contains it.
rule_of() {
  local file=$1 best="" r folder
  for r in "${rules[@]}"; do
    folder=${r%%|*}
    if [[ $file == "$folder"/* && ${#folder} -gt ${#best} ]]; then best=$folder; fi
  done
  echo "$best"
}

violations=0
checked=0
while IFS= read -r file; do
  folder=$(rule_of "$file")
  [ -n "$folder" ] || continue
  allowed=""
  for r in "${rules[@]}"; do
    if [ "${r%%|*}" = "$folder" ]; then allowed=${r#*|}; fi
  done
  for e in "${exceptions[@]}"; do
    if [ "${e%%|*}" = "$file" ]; then allowed="$allowed|${e#*|}"; fi
  done
  while IFS=: read -r line included; do
    checked=$((checked + 1))
    if ! [[ $included =~ ^($allowed)$ ]]; then
      echo "layering: $file:$line includes \"$included\", which $folder/ may not use (allowed: $allowed)"
      violations=$((violations + 1))
    fi
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"(core|kernels|probes|models|samples|cli|viewer)/' "$file" \
             | sed -E 's/^([0-9]+):[^"]*"([^"]+)".*/\1:\2/')
done < <(git ls-files 'core/*' 'kernels/*' 'probes/*' 'viewer/*' 'models/*' 'samples/*' 2>/dev/null \
           | grep -E '\.(h|cpp|cu|cuh)$' | grep -v '^samples/custom_model/' \
           || find core kernels probes viewer models samples -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh')

if [ "$checked" -eq 0 ]; then
  echo "layering: no includes found under $root: wrong folder?" >&2
  exit 1
fi
if [ "$violations" -gt 0 ]; then
  echo "layering: $violations include(s) against the rules (docs/architecture.md, \"Layers\")"
  exit 1
fi
echo "layering: $checked includes checked, every one allowed"
