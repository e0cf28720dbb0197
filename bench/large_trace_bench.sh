#!/usr/bin/env bash
# bench/large_trace_bench.sh: `ampscope report`, `ampscope diff` and ampscope-view's open on traces of STEPS x
# 1,000 op rows (issue 37: 100,000 steps = 100M rows), each as its own process, with its wall, user and system
# time and its peak RSS (/usr/bin/time's %M: the kernel's high-water mark of the process, as writer_rss.sh's
# VmRSS samples but without sampling), beside the floor of `ampscope --help` (the shared libraries it maps:
# about 235 MiB with CUDA's, whatever the trace). The traces are analysis_bench's (its run a, the fp16 run that overflows
# once 3/4 of the way, and run b, the same with every statistic perturbed and the planted rms divergence at the
# middle step), written once into CACHE (default $AMPSCOPE_BENCH_CACHE, else BUILD/bench-cache) and reused.
#
# Premises, checked after timing (exit 1 when one breaks, whatever the timings; the figures then measure
# something else): the report counts STEPS steps and STEPS x 1,000 op rows and finds exactly the planted
# f16_overflow (step 3/4 of STEPS, forward linear in blocks.20.mlp.fc2); the diff aligns STEPS x 1,000 rows and
# first parts at the planted step in blocks.7.attn's matmul with the statistic rms; the viewer (when BUILD has
# ampscope-view and xvfb-run exists) exits 0 and, opened without --step, shows the overflow's step first (the
# trace's early anomaly, from /steps: first_anomaly_ms is the time to that frame, before the analysis ends) and
# ends on it (the analysis's first anomaly). ctest
# runs it at 20 steps (bench_large_trace_premises); the figures in bench/RESULTS.md come from larger runs.
#
#   bench/large_trace_bench.sh BUILD [STEPS] [CACHE]     # STEPS default 10000 (10M rows a trace)
set -uo pipefail
build=$(realpath "${1:?usage: large_trace_bench.sh BUILD [STEPS] [CACHE]}")
steps=${2:-10000}
cache=${3:-${AMPSCOPE_BENCH_CACHE:-$build/bench-cache}}
python=/usr/bin/python3
rows=$((steps * 1000))
planted=$((steps / 2))
overflow=$((3 * steps / 4))
failed=0
broken() {
  echo "large_trace_bench: premise broken: $*" >&2
  failed=1
}

mkdir -p "$cache"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg); STEPS $steps ($rows op rows a trace)"

# timed LABEL COMMAND...: runs it, prints "LABEL wall_s user_s sys_s peak_MiB exit", leaves its stdout in
# $out/LABEL.out. Exit status 0 or 1 (a report with anomalies, a diff that diverges) counts as a run.
timed() {
  local label=$1
  shift
  /usr/bin/time -f '%e %U %S %M %x' -o "$out/$label.time" "$@" >"$out/$label.out" 2>"$out/$label.err"
  # A non-zero exit adds a line "Command exited with non-zero status N" before the figures.
  read -r wall user sys kib status < <(tail -1 "$out/$label.time")
  printf '%-10s wall %7.2f s  user %7.2f s  sys %6.2f s  peak %7.1f MiB  exit %s\n' "$label" "$wall" "$user" "$sys" \
    "$(echo "$kib / 1024" | bc -l)" "$status"
  if [[ $status != 0 && $status != 1 ]]; then
    broken "$label exited $status: $(tail -3 "$out/$label.err")"
  fi
}

# The program's own floor: `ampscope --help` maps its shared libraries (CUDA's among them) and nothing else.
timed baseline "$build/bin/ampscope" --help
timed write "$build/bench/analysis_bench" --steps "$steps" --cache "$cache" --write-only
dir=$(tail -1 "$out/write.out")
a=$dir/a-fp16.h5
b=$dir/b-fp16-perturbed.h5
if [[ ! -f $a || ! -f $b ]]; then
  broken "no traces in '$dir' ($(tail -2 "$out/write.err"))"
  exit 1
fi
echo "traces: $(du -h "$a" | cut -f1) and $(du -h "$b" | cut -f1) in $dir"

timed report "$build/bin/ampscope" report --json "$a"
timed diff "$build/bin/ampscope" diff --json "$a" "$b"

$python - "$out/report.out" "$out/diff.out" "$steps" "$rows" "$planted" "$overflow" <<'EOF' || failed=1
import json, sys
report_path, diff_path, steps, rows, planted, overflow = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
problems = []
def expect(what, want, found):
    if want != found:
        problems.append(f"{what}: expected {want}, found {found}")
try:
    r = json.load(open(report_path))
    expect("report: steps", steps, r["steps"])
    expect("report: op rows", rows, r["op_rows"])
    expect("report: anomalies", [("f16_overflow", overflow, "forward", "linear", "blocks.20.mlp.fc2")],
           [(x["cause"], x["step"], x["phase"], x["op"], x["module"]) for x in r["anomalies"]])
except Exception as e:  # no JSON: the report failed (its error is in report.err)
    problems.append(f"report: no JSON report ({e})")
try:
    d = json.load(open(diff_path))
    expect("diff: steps compared", steps, d["steps_compared"])
    expect("diff: op rows aligned", rows, d["ops_aligned"])
    f = d.get("first_divergence") or {}
    k = f.get("key", {})
    expect("diff: first divergence", (planted, "forward", "blocks.7.attn", "matmul", 0, "rms"),
           (k.get("step"), k.get("phase"), k.get("module"), k.get("op"), k.get("occurrence"), f.get("stat")))
except Exception as e:
    problems.append(f"diff: no JSON comparison ({e})")
for p in problems:
    print(f"large_trace_bench: premise broken: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF

view=$build/bin/ampscope-view
if [[ -x $view ]] && command -v xvfb-run >/dev/null; then
  # Opened without --step: the first frame, the early anomaly (the trace's /steps name the overflow's step) with its
  # rows, then the analysis in the background, which ends on the same step.
  timed view xvfb-run -a -s '-screen 0 1280x800x24' "$view" "$a" --timings --scroll-frames 1 --size 1280x800
  grep -E '^(open_ms|first_frame_ms|first_anomaly_ms|first_anomaly_from|ready_ms|selected_step) ' "$out/view.out" | tr '\n' ' '
  echo
  first=$(awk '$1 == "first_anomaly_step" {print $2}' "$out/view.out")
  [[ $first == "$overflow" ]] || broken "viewer: expected to show step $overflow (the overflow) first, found '${first:-none}'"
  selected=$(awk '$1 == "selected_step" {print $2}' "$out/view.out")
  [[ $selected == "$overflow" ]] || broken "viewer: expected to end on step $overflow (the overflow), found '${selected:-none}'"
else
  echo "view: skipped (no ampscope-view in $build/bin, or no xvfb-run)"
fi
exit $failed
