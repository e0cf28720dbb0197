# bench/step_times.sh: shell functions the twin's benches share (sourced, not run). They need $ampscope (the
# binary) and $work (a scratch folder).
#   step_ms TRACE     the median of the trace's /steps time_ms after its first two steps (warm-up); exits 1 when
#                     the export's column 10 is not time_ms or the trace has fewer than 3 steps (no median to take)
#   median V...       the median of the numbers given
#   premise NAME TRACE CHECKS...   bench/premise.py on TRACE (the run's rows and losses, read with h5py): exits 1
#                     with "NAME: premise broken: expected X, found Y" when the run is not the one the figures name

step_ms() {
  "$ampscope" export "$1" --csv "$work/csv" >/dev/null
  local column rows
  column=$(head -n 1 "$work/csv/steps.csv" | cut -d, -f10)
  rows=$(($(wc -l <"$work/csv/steps.csv") - 1))
  if [[ $column != time_ms || $rows -lt 3 ]]; then
    echo "step_ms: premise broken: expected steps.csv column 10 time_ms and at least 3 steps, found '$column' and $rows steps ($1)" >&2
    exit 1
  fi
  awk -F, 'NR > 3 { print $10 }' "$work/csv/steps.csv" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

premise() { /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/premise.py" "$@" || exit 1; }
