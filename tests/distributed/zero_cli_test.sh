#!/bin/bash
# ZeRO-1 and resuming on another number of ranks through the command line (`ampscope train --ddp
# --shard-optimizer`, docs/distributed.md): --help describes the option; without --ddp it trains as one
# process and says so; a checkpoint written by 2 sharded ranks resumes on 3 ranks and on 1 (a warning names
# both counts); one whose --batch 8 does not split over 3 ranks is refused on 3 with the message naming the
# checkpoint's 2 ranks, the new 3 and the rank counts that would do. Skips (77) without an MPI launcher.
#   tests/distributed/zero_cli_test.sh LAUNCHER AMPSCOPE
set -u
launcher=$1 ampscope=$(realpath "$2")
if [ -z "$launcher" ]; then
  echo "skipped: this build has no MPI process group (AMPSCOPE_MPI=OFF, or no MPI launcher was found at configure time); install Open MPI (openmpi-bin, libopenmpi-dev: scripts/setup.sh) and configure with -DAMPSCOPE_MPI=ON"
  exit 77
fi
if ! command -v "$launcher" >/dev/null 2>&1; then
  echo "skipped: the MPI launcher '$launcher' is not there any more; install openmpi-bin (scripts/setup.sh)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
failures=0
fail() {
  echo "FAIL: $1"
  sed 's/^/   | /' log | head -30
  failures=$((failures + 1))
}
# expect WANT STATUS TEXT: the command's exit STATUS is what WANT says (ok: 0, fail: not 0) and its output
# (in log) holds TEXT.
expect() {
  local want=$1 got=$2 text=$3
  if [ "$want" = ok ] && [ "$got" -ne 0 ]; then fail "$text: exit status $got"; return; fi
  if [ "$want" = fail ] && [ "$got" -eq 0 ]; then fail "$text: exit status 0, expected a refusal"; return; fi
  grep -qF -- "$text" log || fail "the output lacks: $text"
}
common=(train --sample mlp --precision fp16 --device cpu --probe off --seed 5)
mpi() { timeout 120 "$launcher" --oversubscribe -np "$@"; }

"$ampscope" train --help >log 2>&1
expect ok $? "--shard-optimizer"

"$ampscope" "${common[@]}" --batch 12 --steps 1 --shard-optimizer >log 2>&1
expect ok $? "ampscope train: note: --shard-optimizer without --ddp or an MPI launcher: one process keeps the whole optimizer state, as without it (the same bits)"

mpi 2 "$ampscope" "${common[@]}" --batch 12 --steps 2 --checkpoint ck.h5 --ddp --shard-optimizer >log 2>&1
expect ok $? "summary: 2 steps of 'mlp'"
mpi 3 "$ampscope" "${common[@]}" --batch 12 --steps 2 --resume ck.h5 --ddp --shard-optimizer >log 2>&1
expect ok $? "ampscope train: warning: --resume: 'ck.h5' was written by a run of 2 rank(s) and resumed on 3: the same training up to the order of the additions"
"$ampscope" "${common[@]}" --batch 12 --steps 2 --resume ck.h5 >log 2>&1
expect ok $? "ampscope train: warning: --resume: 'ck.h5' was written by a run of 2 rank(s) and resumed on 1:"

mpi 2 "$ampscope" "${common[@]}" --batch 8 --steps 1 --checkpoint ck8.h5 --ddp --shard-optimizer >log 2>&1
expect ok $? "summary: 1 step of 'mlp'"
mpi 3 "$ampscope" "${common[@]}" --batch 8 --steps 1 --resume ck8.h5 --ddp --shard-optimizer >log 2>&1
expect fail $? "--resume: 'ck8.h5' was written by a run of 2 rank(s); resuming it on 3 ranks needs a global --batch that splits evenly over 3, and --batch 8 does not"
grep -qF "hint: resume on a number of ranks that divides 8 (mpirun -np N with N one of 1, 2, 4, 8), for instance on the checkpoint's 2" log ||
  fail "the refusal lacks its hint"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "ok: --help, the one-process note, 2 -> 3 and 2 -> 1 ranks resumed, 2 -> 3 with --batch 8 refused"
