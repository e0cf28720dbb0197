#!/usr/bin/env bash
# Source this on the GPU machine before running the bundle's programs:   . scripts/device-env.sh [BUNDLE_LIB_DIR]
# (scripts/device-check.sh run does.) The bundle carries the project's libraries and the Debian ones they need,
# but never the CUDA runtime, cuBLAS or NCCL (hundreds of MiB): those come from the GPU machine, from the CUDA
# toolkit (/usr/local/cuda), the system's library folders, or the Python environment's nvidia-* wheels (PyTorch
# ships cuBLAS, the CUDA runtime and NCCL there). This puts the bundle's lib/ first on LD_LIBRARY_PATH, then
# every folder where one of those was found, and prints one line per library, so a missing one shows before
# a program fails to start. It sets DEVICE_ENV_MISSING to the names not found (empty when all were).
# PYTHON names the Python to ask for its site-packages (default: python3 on PATH).
_de_dirs=()
[ -n "${1:-}" ] && _de_dirs+=("$1")
DEVICE_ENV_MISSING=""
# What the programs link (kernels/CMakeLists.txt): CUDA 13's runtime and cuBLAS, NCCL 2; and the driver.
for _de_lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcuda.so.1; do
  _de_found=""
  for _de_d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
               /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib/wsl/lib; do
    [ -e "$_de_d/$_de_lib" ] && { _de_found=$_de_d; break; }
  done
  if [ -z "$_de_found" ] && command -v ldconfig >/dev/null 2>&1; then
    _de_found=$(ldconfig -p 2>/dev/null | awk -v n="$_de_lib" '$1 == n { sub(/.*=> /, ""); print; exit }')
    [ -n "$_de_found" ] && _de_found=$(dirname "$_de_found")
  fi
  if [ -z "$_de_found" ] && [ "$_de_lib" != libcuda.so.1 ]; then
    # The Python environment's wheels: site-packages/nvidia/<package>/lib (cu13/lib for CUDA 13's), torch/lib.
    _de_found=$("${PYTHON:-python3}" - "$_de_lib" 2>/dev/null <<'PY'
import glob, os, site, sys
roots = list(site.getsitepackages()) + [site.getusersitepackages()]
for r in roots:
    for pattern in ("nvidia/**/", "torch/lib/"):
        for p in sorted(glob.glob(os.path.join(r, pattern, sys.argv[1]), recursive=True)):
            print(os.path.dirname(p))
            raise SystemExit
PY
)
  fi
  if [ -n "$_de_found" ]; then
    echo "device-env: $_de_lib in $_de_found"
    _de_dirs+=("$_de_found")
  else
    echo "device-env: $_de_lib NOT FOUND"
    DEVICE_ENV_MISSING="${DEVICE_ENV_MISSING:+$DEVICE_ENV_MISSING }$_de_lib"
  fi
done
if [ ${#_de_dirs[@]} -gt 0 ]; then
  _de_joined=$(printf '%s\n' "${_de_dirs[@]}" | awk 'NF && !seen[$0]++' | paste -sd: -)
  export LD_LIBRARY_PATH="${_de_joined}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export DEVICE_ENV_MISSING
unset _de_dirs _de_lib _de_found _de_d _de_joined
