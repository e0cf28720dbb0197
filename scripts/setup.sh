#!/usr/bin/env bash
# Installs the Debian packages ampscope needs (only those missing), then configures and builds the
# project with CMake + Ninja into build/ (Release unless CMAKE_BUILD_TYPE says otherwise).
#
#   scripts/setup.sh                       # everything; CUDA when nvcc is found, viewer when its libraries are
#   scripts/setup.sh -DAMPSCOPE_CUDA=OFF   # extra arguments go to cmake's configure step
#
# Works as root or through sudo. Safe to run again: installed packages are skipped, builds are incremental.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${AMPSCOPE_BUILD_DIR:-$root/build}

packages=(
  cmake ninja-build g++ pkgconf                      # build tools
  libfmt-dev libcli11-dev nlohmann-json3-dev libtomlplusplus-dev
  libopenblas-dev                                    # CPU matrix products
  libicu-dev                                         # Unicode classes for GPT-2's tokenizer (--text)
  libhdf5-dev hdf5-tools python3-h5py python3-pandas # traces (pandas: docs/examples/read_trace.py)
  libimgui-dev libglfw3-dev libgl-dev libstb-dev     # viewer
  xvfb xauth libgl1-mesa-dri                         # viewer tests without a screen
  libgtest-dev libgmock-dev libbenchmark-dev         # tests and benchmarks
  python3-torch                                      # PyTorch 1.13 (CPU) as the tests' reference for f32/bf16 ops
  python3-regex                                      # the regex module GPT-2 split text with: tests/tokenizer
  openmpi-bin libopenmpi-dev                         # the MPI process group and its 2-rank tests (mpirun)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} > 0)); then
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
  else
    echo "setup: error: these Debian packages are missing and installing them needs root or sudo: ${missing[*]}" >&2
    echo "hint: run 'apt-get install ${missing[*]}' as root, then run this script again" >&2
    exit 1
  fi
  echo "setup: installing ${#missing[@]} Debian package(s): ${missing[*]}"
  "${as_root[@]}" apt-get update -q
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#packages[@]} Debian packages are installed"
fi

# The CUDA Toolkit installs nvcc outside PATH; CMake also looks there itself (cmake/cuda.cmake).
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

echo "setup: configuring into $build_dir"
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" "$@"
echo "setup: building"
cmake --build "$build_dir" --parallel
echo "setup: done. Try: $build_dir/bin/ampscope demo"
