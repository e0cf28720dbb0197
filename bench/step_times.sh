# bench/step_times.sh: shell functions the twin's benches share (sourced, not run). They need $ampscope (the
# binary) and $work (a scratch folder).
#   step_ms TRACE     the median of the trace's /steps time_ms after its first two steps (warm-up)
#   median V...       the median of the numbers given

step_ms() {
  "$ampscope" export "$1" --csv "$work/csv" >/dev/null
  awk -F, 'NR > 3 { print $10 }' "$work/csv/steps.csv" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
