#!/bin/sh
# Runs a test program under the MPI launcher with NP ranks (oversubscribed: more ranks than cores is fine),
# or skips (exit 77, ctest's SKIP_RETURN_CODE) with the reason when there is no launcher.
#   tests/distributed/mpirun.sh LAUNCHER NP PROGRAM [ARGS...]
launcher=$1 np=$2
shift 2
if [ -z "$launcher" ]; then
  echo "skipped: this build has no MPI process group (AMPSCOPE_MPI=OFF, or no MPI launcher was found at configure time); install Open MPI (openmpi-bin, libopenmpi-dev: scripts/setup.sh) and configure with -DAMPSCOPE_MPI=ON"
  exit 77
fi
if ! command -v "$launcher" >/dev/null 2>&1; then
  echo "skipped: the MPI launcher '$launcher' is not there any more; install openmpi-bin (scripts/setup.sh)"
  exit 77
fi
exec "$launcher" --oversubscribe -np "$np" "$@"
