#!/usr/bin/env bash
# The cost of proving a fix on a recorded PyTorch run (issue 33), end to end: for each script of
# tests/record/scripts that fix verifies a remedy of (bce_by_hand.py: a module kept in f32; poisson_high_lr.py:
# the learning rate; scaled_f16_train.py: the GradScaler's initial scale), the script run plain, recorded with
# `ampscope record`, and `ampscope fix --run --after K` of that trace (the original, the f32 reference and one
# re-run per remedy, each ended after the first anomaly's step + K), the three alternated ROUNDS times; prints
# each run's wall time, fix's re-runs and verified count, and the medians over the rounds.
# The premise, checked on every round's files after timing (exits 1 with "fix_record_bench: premise broken"): each
# recorded trace is complete (bench/premise.py); fix exited 0, its re-run of the unchanged run reproduced the
# anomaly, the original re-run (and the fp32 one, where there is one) ran, each re-run stopped at the first anomaly's step + AFTER (steps_rerun),
# and a remedy of the kind the script is there for was verified (EXPECTED below; fix.json read, not fix's summary).
#   bench/fix_record_bench.sh [BUILD_DIR] [ROUNDS] [AFTER]
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
after=${3:-10}
here=$(cd "$(dirname "$0")" && pwd)
scripts="$here/../tests/record/scripts"
ampscope=$(cd "$build/bin" && pwd)/ampscope
python=${PYTHON:-/usr/bin/python3}
[[ -x "$ampscope" ]] || { echo "fix_record_bench.sh: no $ampscope (build the ampscope target first)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "torch: $("$python" -c 'import torch; print(torch.__version__)')"
echo "load before: $(uptime | sed 's/.*load average: //')"
echo "fix --after $after, $rounds rounds"

now() { date +%s.%N; }
declare -A times fix_status
for ((r = 1; r <= rounds; r++)); do
  for script in bce_by_hand.py poisson_high_lr.py scaled_f16_train.py; do
    dir="$work/$r-${script%.py}"
    mkdir -p "$dir"
    cp "$scripts/$script" "$dir/train.py"
    cd "$dir"
    t0=$(now)
    "$python" train.py >/dev/null 2>&1
    t1=$(now)
    "$ampscope" record --out run.h5 -- "$python" train.py >/dev/null 2>&1
    t2=$(now)
    status=0
    "$ampscope" fix --run --json --after "$after" run.h5 >fix.json 2>fix.err || status=$?
    t3=$(now)
    fix_status[$r.$script]=$status
    summary=$("$python" -c 'import json, sys
d = json.load(open("fix.json"))
print(len(d["runs"]), d["verified"], " ".join(r["name"] for r in d["runs"] if r.get("verified")))')
    plain=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}')
    rec=$(awk -v a="$t1" -v b="$t2" 'BEGIN {printf "%.2f", b - a}')
    fix=$(awk -v a="$t2" -v b="$t3" 'BEGIN {printf "%.2f", b - a}')
    times[$script]+="$plain,$rec,$fix "
    printf '  round %d %-22s plain %6s s  record %6s s  fix %6s s (exit %d; re-runs, verified, which: %s)\n' \
      "$r" "$script" "$plain" "$rec" "$fix" "$status" "$summary"
    cd "$work"
  done
done
echo "load after: $(uptime | sed 's/.*load average: //')"
# The remedy kind each script is there to prove (docs/report-format.md, Remedies).
declare -A expected=([bce_by_hand.py]=cast_f32 [poisson_high_lr.py]=learning_rate [scaled_f16_train.py]=init_scale)
for ((r = 1; r <= rounds; r++)); do
  for script in bce_by_hand.py poisson_high_lr.py scaled_f16_train.py; do
    dir="$work/$r-${script%.py}"
    "$python" "$here/premise.py" fix_record_bench "$dir/run.h5" --complete || exit 1
    "$python" - "$dir" "$script" "$after" "${expected[$script]}" "${fix_status[$r.$script]}" <<'PY' || exit 1
import json, sys
folder, script, after, kind, status = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
def broken(expected, found):
    sys.exit(f"fix_record_bench: premise broken: expected {expected}, found {found} ({script}, {folder})")
if status != 0:
    broken("fix to exit 0", f"exit {status}: {open(folder + '/fix.err').read().strip()[:300]}")
d = json.load(open(folder + "/fix.json"))
runs = {r["name"]: r for r in d["runs"]}
if not d.get("reproduced"):
    broken("the unchanged re-run to reproduce the anomaly", f"reproduced {d.get('reproduced')}")
# The fp32 reference only where the run was not f32 already (poisson_high_lr.py has none).
for name in ("original", "fp32"):
    if (name == "original" or name in runs) and not runs.get(name, {}).get("ran"):
        broken(f"the {name} re-run to have run", f"{runs.get(name, {}).get('error', 'no such run')}")
want = d["first_anomaly"]["step"] + after + 1
if d["steps_rerun"] != want:
    broken(f"re-runs of {want} steps (first anomaly at step {d['first_anomaly']['step']}, --after {after})",
           f"{d['steps_rerun']}")
verified = [r["kind"] for r in d["runs"] if r.get("verified")]
if kind not in verified:
    broken(f"a verified remedy of kind {kind}", f"verified kinds {verified} (of {[r['kind'] for r in d['runs']]})")
PY
  done
done
echo "medians over the rounds (s): script plain record fix"
for script in bce_by_hand.py poisson_high_lr.py scaled_f16_train.py; do
  # shellcheck disable=SC2086
  printf '%s\n' ${times[$script]} | awk -F, -v s="$script" '
    { p[NR] = $1; r[NR] = $2; f[NR] = $3 }
    function median(a, n,   i, j, t) {
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    END { printf "  %-22s %6.2f %6.2f %6.2f\n", s, median(p, NR), median(r, NR), median(f, NR) }'
done
