#!/bin/sh
# Where the trace writer's CPU time goes (issue 37): perf samples of one trace_bench case, summed into the
# writer's stages by symbol. Needs perf (linux-perf) with perf_event_paranoid <= 2.
#   bench/trace_profile.sh build/bench/trace_bench 'throughput/rows_per_step:10000/deflate:1/' [MIN_TIME]
set -eu
if [ $# -lt 2 ]; then
  echo "usage: bench/trace_profile.sh TRACE_BENCH FILTER [MIN_TIME]" >&2
  echo "hint: bench/trace_profile.sh build/bench/trace_bench 'health_trace/steps:1000/deflate:1/'" >&2
  exit 2
fi
data=$(mktemp /tmp/ampscope-trace-profile.XXXXXX)
trap 'rm -f "$data"' EXIT
perf record -q -F 2000 -o "$data" "$1" --benchmark_filter="$2" --benchmark_min_time="${3:-2}" >&2
# Each symbol's share, then summed per stage (a symbol goes to the first stage whose pattern it matches).
perf report -i "$data" --no-children --sort dso,sym --stdio 2>/dev/null | grep '%' | awk '
{ p = $1; sub("%", "", p); line = $0;
  if (line ~ /libz/) b = "compress (zlib deflate)";
  else if (line ~ /transpose_16x16|shuffle_records|shuffle_scalar/) b = "shuffle";
  else if (line ~ /adler32/) b = "checksum (Adler-32)";
  else if (line ~ /Interner|_Hash_bytes|memcmp|detail::encode|TraceWriter::write|write_record|hand_over|to_utf8|TextHash/) b = "encode (caller: row to record, text ids)";
  else if (line ~ /memmove|memcpy|memset/) b = "copies and zero fill (libc)";
  else if (line ~ /libhdf5/) b = "HDF5 (write_chunk, flush, index)";
  else if (line ~ /normal_distribution|mersenne|ieee754|OpRow::~OpRow|\)::throughput|\)::health_trace|TraceGenerator|libm/) b = "the benchmark (row generator, loop)";
  else if (line ~ /pthread|futex|_raw_spin|finish_task_switch|schedule|try_to_wake|__lll/) b = "threads (locks, wake-ups)";
  else if (line ~ /ext4|filemap|folio|copy_.*iter|iomap|vfs_write|jbd2|block_write/) b = "kernel: file writes";
  else if (line ~ /page_fault|clear_page|handle_mm|anonymous_page|unmap|alloc_pages|mmap|memcg|lruvec|malloc|free|H5FL/) b = "memory (allocation, page faults)";
  else if (line ~ /\[k\]/) b = "kernel: other";
  else b = "other";
  s[b] += p; t += p }
END { for (k in s) printf "%6.1f%%  %s\n", 100 * s[k] / t, k }' | sort -rn
