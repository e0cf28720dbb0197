#!/usr/bin/env bash
# tests/train/twin_options_test.sh: `ampscope train --twin` / `--twin-every N` with bad values (on the command
# line and in a --config file) exit 2, the usage-error status of every command (docs/training.md), with a
# message naming the option, the value and what is allowed; nothing is trained and no trace is written.
#   twin_options_test.sh AMPSCOPE_BINARY SCRATCH_DIR
set -uo pipefail
ampscope=${1:?usage: twin_options_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
work=${2:?usage: twin_options_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
rm -rf "$work" && mkdir -p "$work"
failures=0

# expect_usage_error "message piece" args...: exit 2, the piece on stderr, no trace written
expect_usage_error() {
  local piece=$1
  shift
  "$ampscope" train --device cpu --steps 1 "$@" >"$work/out.txt" 2>"$work/err.txt"
  local status=$?
  if [[ $status != 2 ]]; then
    echo "FAIL: 'ampscope train $*' exited $status, expected 2" >&2
    cat "$work/err.txt" >&2
    failures=$((failures + 1))
  elif ! grep -qF -- "$piece" "$work/err.txt"; then
    echo "FAIL: 'ampscope train $*': stderr lacks '$piece':" >&2
    cat "$work/err.txt" >&2
    failures=$((failures + 1))
  fi
  if [[ -e "$work/run.h5" ]]; then
    echo "FAIL: 'ampscope train $*' wrote a trace" >&2
    rm -f "$work/run.h5"
    failures=$((failures + 1))
  fi
}

expect_usage_error "--twin-every: 0 is not allowed; expected an integer >= 1 (1 twins every step)" \
  --out "$work/run.h5" --twin-every 0
expect_usage_error "--twin-every: -3 is not allowed; expected an integer >= 1" --out "$work/run.h5" --twin-every -3
expect_usage_error "--twin-every" --out "$work/run.h5" --twin-every abc
expect_usage_error "--twin-every" --out "$work/run.h5" --twin-every 1.5
expect_usage_error "--twin needs --out FILE" --twin
expect_usage_error "--twin needs --out FILE" --twin-every 2
expect_usage_error "--twin needs a probe level other than off" --out "$work/run.h5" --twin --probe off
printf 'twin-every = 0\n' >"$work/zero.toml"
expect_usage_error "--twin-every: 0 is not allowed" --out "$work/run.h5" --config "$work/zero.toml"
printf 'twin = "yes"\n' >"$work/word.toml"
expect_usage_error "'twin' must be true or false" --out "$work/run.h5" --config "$work/word.toml"
printf 'twin-forward-only = "yes"\n' >"$work/forward.toml"
expect_usage_error "'twin-forward-only' must be true or false" --out "$work/run.h5" --config "$work/forward.toml"
expect_usage_error "--twin needs --out FILE" --twin-forward-only
printf 'twin-f64 = "yes"\n' >"$work/f64.toml"
expect_usage_error "'twin-f64' must be true or false" --out "$work/run.h5" --config "$work/f64.toml"
expect_usage_error "--twin needs --out FILE" --twin-f64
expect_usage_error "--twin needs a probe level other than off" --out "$work/run.h5" --twin-f64 --probe off

# And the good values train, with the table written.
if ! "$ampscope" train --device cpu --steps 2 --twin-every 1 --out "$work/run.h5" >"$work/out.txt" 2>&1; then
  echo "FAIL: --twin-every 1 did not train:" >&2
  cat "$work/out.txt" >&2
  failures=$((failures + 1))
fi

# --twin writes backward rows (phase backward in precision.csv) for an fp16 run; --twin-forward-only none,
# with the same forward rows (the twin's forward pass does not depend on its backward pass).
phases() {  # the phase column's values of a trace's precision.csv, counted
  rm -rf "$work/csv" && "$ampscope" export "$1" --csv "$work/csv" >/dev/null &&
    awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i == "phase") p = i; next } { print $p }' "$work/csv/precision.csv" |
    sort | uniq -c | awk '{ printf "%s=%s ", $2, $1 }'
}
"$ampscope" train --device cpu --precision fp16 --steps 2 --twin --out "$work/both.h5" >/dev/null 2>&1
"$ampscope" train --device cpu --precision fp16 --steps 2 --twin-forward-only --out "$work/forward.h5" >/dev/null 2>&1
both=$(phases "$work/both.h5")
forward=$(phases "$work/forward.h5")
if [[ $both != *backward=* || $forward == *backward=* || ${both#backward=* } != "${forward}" ]]; then
  echo "FAIL: precision rows by phase: --twin '$both', --twin-forward-only '$forward' (expected backward rows only" \
    "with --twin and the same forward rows)" >&2
  failures=$((failures + 1))
fi

# --twin-f64 in an fp32 run: forward rows for f32 ops with local errors (the f32 twin alone has none to write),
# each entry of the report's JSON naming f64 as its reference; the config JSON records twin_f64.
"$ampscope" train --device cpu --precision fp32 --steps 2 --twin --out "$work/f32.h5" >/dev/null 2>&1
"$ampscope" train --device cpu --precision fp32 --steps 2 --twin-f64 --out "$work/f64.h5" >/dev/null 2>&1
local_f32_rows() {  # rows of a trace's precision.csv with out_dtype f32 and local set
  rm -rf "$work/csv" && "$ampscope" export "$1" --csv "$work/csv" >/dev/null &&
    awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) { if ($i == "out_dtype") d = i; if ($i == "local") l = i }; next }
             $d == "f32" && ($l == "1" || $l == "true") { n++ } END { print n + 0 }' "$work/csv/precision.csv"
}
plain_rows=$(local_f32_rows "$work/f32.h5")
f64_rows=$(local_f32_rows "$work/f64.h5")
"$ampscope" report "$work/f64.h5" --json >"$work/f64.json" 2>/dev/null
references=$(grep -o '"reference": *"[a-z0-9]*"' "$work/f64.json" | sort -u | tr -d ' \n')
if [[ $plain_rows != 0 || $f64_rows == 0 || $references != '"reference":"f64"' ]]; then
  echo "FAIL: fp32 local f32 rows: --twin $plain_rows (expected 0), --twin-f64 $f64_rows (expected some);" \
    "report references '$references' (expected only f64)" >&2
  failures=$((failures + 1))
fi
rm -rf "$work/csv" && "$ampscope" export "$work/f64.h5" --csv "$work/csv" >/dev/null 2>&1
if ! grep -q 'twin_f64""*:true' "$work/csv/run.csv"; then
  echo "FAIL: the trace's config does not record twin_f64: true" >&2
  failures=$((failures + 1))
fi
[[ $failures == 0 ]] && echo "twin_options_test: every bad value exits 2 with its message"
exit $((failures > 0))
