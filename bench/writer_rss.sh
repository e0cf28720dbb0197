#!/usr/bin/env bash
# bench/writer_rss.sh: the trainer's memory over a long run with a trace (issue 36: it grew about 120 bytes a
# step with --out, 12 MB per 100,000 steps, and not without). Runs
#   ampscope train --device cpu --sample mlp --steps STEPS --probe health --out WORK/run.h5
# (and, with --compare, the same run without --out), samples the process's VmRSS from /proc/PID/status every
# INTERVAL seconds with the step it had reached (from its progress lines), and prints the samples, the RSS
# after warm-up (the first sample at or past 10% of the steps), the largest RSS after it, their difference
# and a least-squares slope in bytes per step over the samples after warm-up. Exits 1 when the difference
# exceeds LIMIT_KB (default 1024: "flat within 1 MB after warm-up"), 0 otherwise. Outside the default suite:
# 100,000 steps take about 6 minutes on the 2-core development machine. Results go into bench/RESULTS.md
# ("writer_rss.sh") by hand, with the date, machine and load.
# The premise, checked after the runs (bench/premise.py on WORK/run.h5; exits 1 with "writer_rss: premise broken"
# whatever the RSS): the trace is complete with every one of the STEPS steps asked, each with the same number of op
# rows (the writer wrote what the figures say it wrote), and each run's progress reached step STEPS.
#
# Arguments after `--` are passed to every `ampscope train` (another configuration: `-- --growth-interval
# 1000000` keeps the fp16 run's loss scale from growing into the overflows that, from about step 55,000, make
# the default run skip steps; each burst of skips moves the RSS by up to 2 MB, with or without --out).
#
#   bench/writer_rss.sh [--compare] AMPSCOPE_BINARY [STEPS] [WORK_DIR] [INTERVAL] [LIMIT_KB] [-- TRAIN_ARGS...]
set -uo pipefail
compare=0
if [[ ${1:-} == --compare ]]; then
  compare=1
  shift
fi
positional=()
while (($# > 0)) && [[ $1 != -- ]]; do
  positional+=("$1")
  shift
done
[[ ${1:-} == -- ]] && shift
extra=("$@")
set -- "${positional[@]}"
ampscope=$(realpath "${1:?usage: writer_rss.sh [--compare] AMPSCOPE_BINARY [STEPS] [WORK_DIR] [INTERVAL] [LIMIT_KB]}")
steps=${2:-100000}
work=${3:-$(mktemp -d)}
interval=${4:-2}
limit_kb=${5:-1024}
mkdir -p "$work"

# reached OUT: the steps done by the last progress line printed so far to OUT (lines end in '\r' or '\n'): its
# "(N/STEPS done)", or "step N/" as progress lines were printed before.
reached() { tr '\r' '\n' <"$1" | grep -oE '\([0-9]+/[0-9]+ done|step [0-9]+/' | tail -1 | sed -E 's/^\(//; s/^step //; s/\/.*//'; }

# measure LABEL ARGS...: runs train, samples RSS; prints the samples and a summary line; returns 1 past the limit.
measure() {
  local label=$1
  shift
  local out="$work/$label.out" samples="$work/$label.rss"
  : >"$samples"
  # stdbuf: progress lines reach the file as they are printed (stdout to a file is block-buffered).
  AMPSCOPE_NUM_THREADS=${AMPSCOPE_NUM_THREADS:-2} stdbuf -oL "$ampscope" train --device cpu --sample mlp --steps "$steps" \
    --probe health "${extra[@]}" "$@" >"$out" 2>"$work/$label.err" &
  local pid=$! start=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    local rss step
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
    step=$(reached "$out")
    [[ -n $rss && -n $step ]] && echo "$((SECONDS - start)) $step $rss" >>"$samples"
    sleep "$interval"
  done
  wait "$pid"
  local status=$?
  if [[ $status != 0 ]]; then
    echo "$label: ampscope train exited $status:" >&2
    cat "$work/$label.err" >&2
    return 2
  fi
  echo "# $label: seconds step rss_kb"
  cat "$samples"
  awk -v label="$label" -v steps="$steps" -v limit="$limit_kb" '
    { t[NR] = $1; s[NR] = $2; r[NR] = $3 }
    END {
      warm = 0
      for (i = 1; i <= NR; ++i) if (s[i] >= steps / 10) { warm = i; break }
      if (warm == 0 || warm == NR) { printf "%s: too few samples after warm-up (%d samples)\n", label, NR; exit 2 }
      top = r[warm]; n = 0; sx = sy = sxx = sxy = 0
      for (i = warm; i <= NR; ++i) {
        if (r[i] > top) top = r[i]
        n++; sx += s[i]; sy += r[i]; sxx += s[i] * s[i]; sxy += s[i] * r[i]
      }
      slope = (n * sxy - sx * sy) / (n * sxx - sx * sx) * 1024  # bytes per step
      printf "%s: %d samples; RSS %d kB at step %d (warm-up), at most %d kB after (+%d kB) to step %d; slope %.1f bytes/step\n",
             label, NR, r[warm], s[warm], top, top - r[warm], s[NR], slope
      exit (top - r[warm] > limit) ? 1 : 0
    }' "$samples"
}

echo "writer_rss: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $steps steps${extra[*]:+, train args: ${extra[*]}}"
measure with-out --out "$work/run.h5"
result=$?
if ((compare)); then
  measure without-out
fi
echo "writer_rss: load $(cut -d' ' -f1-3 /proc/loadavg) at the end"
for label in with-out $( ((compare)) && echo without-out); do
  done_steps=$(reached "$work/$label.out")
  if [[ $done_steps != "$steps" ]]; then
    echo "writer_rss: premise broken: expected the $label run's progress to reach $steps steps done, found '$done_steps'" >&2
    exit 1
  fi
done
/usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/premise.py" writer_rss "$work/run.h5" --steps "$steps" --rows ops=same || exit 1
if ((result == 1)); then
  echo "writer_rss: FAIL: RSS grew more than $limit_kb kB after warm-up with --out" >&2
fi
exit "$result"
