#!/usr/bin/env bash
# The cost of `ampscope record` (issue 32): a bf16 two-block transformer with d 256 (record_bench_train.py,
# written as a user writes it) timed plain, under `ampscope record --probe health`, and under
# `ampscope record --probe health --sample-every 10`, and under `ampscope record --probe health --record-optimizer`
# (the optimizer's element-wise ops recorded too, as before they were left out by default), the four alternated
# ROUNDS times in one run; prints each run's step times, the ratios of the medians over the rounds, and the median
# over the rounds of each round's own ratio to its plain run (what a burst of other work on a shared machine moves
# least: the runs of one round are seconds apart). One thread (torch.set_num_threads(1)). A fifth run,
# `--probe health --sample-every 10 --flight-recorder 4` (every step recorded and held, the finite ones not written),
# and with BASE_PYTHON_DIR=DIR a sixth, `--probe health` with the recorder in DIR (AMPSCOPE_PYTHON_DIR: an older
# python/ folder, e.g. from `git archive`), so that a change is measured against its baseline in the same rounds.
# CLOCK=cpu: each run's steps timed in the script's CPU time (record_bench_train.py --clock cpu: the recorder runs in
# the script's process and is counted, the `ampscope record` writer process is not), steadier than wall time when
# other work loads the machine.
# The premise, checked on every run after timing (bench/premise.py on the traces; exits 1 with "premise broken"):
# each recorded run wrote a complete trace of STEPS steps; health, the baseline and record-optimizer have /ops rows
# in every step (the same number of forward and of backward rows each step), optimizer rows only with
# --record-optimizer; the sampled and flight-recorder runs have op rows only in steps 0, 10, 20, ... (their share);
# the plain run ran no recorder, the recorded runs one, the baseline the one in BASE_PYTHON_DIR (the script's last
# line, `recorder DIR`, names the package's folder).
#   [BASE_PYTHON_DIR=DIR] [CLOCK=wall|cpu] bench/record_bench.sh [BUILD_DIR] [ROUNDS] [STEPS]
# Steps after the first two count (warm-up); STEPS - 2 should be a multiple of 10 so the sampled runs
# record their share (steps 10, 20, ...).
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
steps=${3:-22}
here=$(cd "$(dirname "$0")" && pwd)
ampscope="$build/bin/ampscope"
python=${PYTHON:-/usr/bin/python3}
clock=${CLOCK:-wall}
[[ $clock == wall || $clock == cpu ]] || { echo "record_bench.sh: CLOCK must be wall or cpu, not '$clock'" >&2; exit 2; }
[[ -x "$ampscope" ]] || { echo "record_bench.sh: no $ampscope (build the ampscope target first)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "torch: $("$python" -c 'import torch; print(torch.__version__)')"
echo "load before: $(uptime | sed 's/.*load average: //')"
echo "clock: $clock (per step; cpu: the script's process time, the writer process not counted)"
echo "model: d 256, 2 blocks, 4 heads, batch 8, seq 64, vocab 512, bf16 CPU autocast, AdamW; $steps steps, the first 2 not timed"

declare -A med mean
declare -A last recorder
ratios_health="" ratios_every10="" ratios_optimizer="" ratios_flight="" ratios_base=""
kinds="plain health every10 optimizer flight"
# The baseline right after health, so that the two are seconds apart in each round.
[[ -n "${BASE_PYTHON_DIR:-}" ]] && kinds="plain health base every10 optimizer flight"
run() {  # run KIND ROUND: appends the run's median and mean step time
  local kind=$1 out
  case $kind in
    plain)  out=$("$python" "$here/record_bench_train.py" --steps "$steps" --clock "$clock") ;;
    health) out=$("$ampscope" record --out "$work/$2.h.h5" --probe health -- "$python" "$here/record_bench_train.py" --steps "$steps" --clock "$clock" 2>/dev/null) ;;
    every10) out=$("$ampscope" record --out "$work/$2.s.h5" --probe health --sample-every 10 -- "$python" "$here/record_bench_train.py" --steps "$steps" --clock "$clock" 2>/dev/null) ;;
    optimizer) out=$("$ampscope" record --out "$work/$2.o.h5" --probe health --record-optimizer -- "$python" "$here/record_bench_train.py" --steps "$steps" --clock "$clock" 2>/dev/null) ;;
    flight) out=$("$ampscope" record --out "$work/$2.f.h5" --probe health --sample-every 10 --flight-recorder 4 -- "$python" "$here/record_bench_train.py" --steps "$steps" --clock "$clock" 2>/dev/null) ;;
    base) out=$(AMPSCOPE_PYTHON_DIR="$BASE_PYTHON_DIR" "$ampscope" record --out "$work/$2.b.h5" --probe health -- "$python" "$here/record_bench_train.py" --steps "$steps" --clock "$clock" 2>/dev/null) ;;
  esac || { echo "record_bench: round $2's $kind run exited with status $? (its stderr is not kept: run it by hand)" >&2; exit 1; }
  local line
  line=$(grep '^step_ms' <<<"$out")
  recorder[$2.$kind]=$(awk '$1 == "recorder" { print $2 }' <<<"$out")
  med[$kind]+="$(awk '{print $3}' <<<"$line") "
  last[$kind]="$(awk '{print $3, $5}' <<<"$line")"
  mean[$kind]+="$(awk '{print $5}' <<<"$line") "
  printf '  round %d %-8s step ms: median %s mean %s\n' "$2" "$kind" "$(awk '{print $3}' <<<"$line")" "$(awk '{print $5}' <<<"$line")"
}
for ((r = 1; r <= rounds; r++)); do
  for kind in $kinds; do run "$kind" "$r"; done
  read -r pm_r pa_r <<<"${last[plain]}"
  ratios_health+="$(awk -v a="${last[health]% *}" -v b="$pm_r" 'BEGIN {print a / b}') "
  ratios_every10+="$(awk -v a="${last[every10]#* }" -v b="$pa_r" 'BEGIN {print a / b}') "
  ratios_optimizer+="$(awk -v a="${last[optimizer]% *}" -v b="$pm_r" 'BEGIN {print a / b}') "
  ratios_flight+="$(awk -v a="${last[flight]#* }" -v b="$pa_r" 'BEGIN {print a / b}') "
  [[ -n "${BASE_PYTHON_DIR:-}" ]] && ratios_base+="$(awk -v a="${last[base]% *}" -v b="$pm_r" 'BEGIN {print a / b}') "
done
echo "load after: $(uptime | sed 's/.*load average: //')"

premise() { "$python" "$here/premise.py" record_bench "$@" || exit 1; }
broken() { echo "record_bench: premise broken: expected $1, found $2" >&2; exit 1; }
base_dir=""
[[ -n "${BASE_PYTHON_DIR:-}" ]] && base_dir=$(realpath "$BASE_PYTHON_DIR")
for ((r = 1; r <= rounds; r++)); do
  premise "$work/$r.h.h5" --steps "$steps" --rows ops.forward=same --rows ops.backward=same --rows ops.optimizer=none
  premise "$work/$r.s.h5" --steps "$steps" --rows ops=mod:10
  premise "$work/$r.o.h5" --steps "$steps" --rows ops.forward=same --rows ops.backward=same --rows ops.optimizer=every
  premise "$work/$r.f.h5" --steps "$steps" --rows ops=mod:10
  [[ -n $base_dir ]] && premise "$work/$r.b.h5" --steps "$steps" --rows ops.forward=same --rows ops.backward=same
  for kind in $kinds; do
    got=${recorder[$r.$kind]:-}
    case $kind in
      plain) [[ $got == none ]] || broken "round $r's plain run without a recorder" "recorder '$got'" ;;
      base) [[ $got == "$base_dir" ]] || broken "round $r's baseline recorded by $base_dir" "recorder '$got'" ;;
      *) [[ -n $got && $got != none ]] || broken "round $r's $kind run recorded" "recorder '$got'" ;;
    esac
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
pm=$(median <<<"${med[plain]}"); hm=$(median <<<"${med[health]}")
pa=$(median <<<"${mean[plain]}"); ha=$(median <<<"${mean[health]}"); sa=$(median <<<"${mean[every10]}")
om=$(median <<<"${med[optimizer]}")
echo "medians over $rounds rounds (ms per step): plain median $pm mean $pa; health median $hm mean $ha; every10 mean $sa; record-optimizer median $om"
awk -v pm="$pm" -v hm="$hm" -v pa="$pa" -v ha="$ha" -v sa="$sa" -v om="$om" 'BEGIN {
  printf "ratio health / plain: %.2fx (median steps), %.2fx (mean steps)\n", hm / pm, ha / pa
  printf "ratio health --sample-every 10 / plain: %.2fx (mean steps: one recorded step in ten)\n", sa / pa
  printf "ratio health --record-optimizer / plain: %.2fx (median steps)\n", om / pm }'
echo "per-round ratios to the round's plain run: health $ratios_health; every10 (means) $ratios_every10; record-optimizer $ratios_optimizer"
echo "per-round ratios: flight recorder (means) $ratios_flight${BASE_PYTHON_DIR:+; baseline health $ratios_base}"
echo "median of the per-round ratios: health $(median <<<"$ratios_health")x, every10 $(median <<<"$ratios_every10")x, record-optimizer $(median <<<"$ratios_optimizer")x, flight recorder (means) $(median <<<"$ratios_flight")x${BASE_PYTHON_DIR:+, baseline health $(median <<<"$ratios_base")x}"
