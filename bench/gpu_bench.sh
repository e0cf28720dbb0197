#!/usr/bin/env bash
# Issue 10's benchmarks on the GPU machine, in one call: unpack the bundle, run the CUDA tests, then time
# the statistics kernel against a device-to-device copy, the probe's overhead per sample (health and full
# over off), the training step per sample (fused AMP kernels on and off), f16/bf16 matrix products, and
# the same models and products in PyTorch eager (bench/pytorch_bench.py). Everything goes to
# $OUT/gpu_bench.md (with the device and the date) and the logs beside it; nothing is written into
# bench/RESULTS.md: copy the numbers there by hand, with what was predicted before.
#
#   bench/gpu_bench.sh pack    # here: build with CUDA (Release) and bundle the programs into .gpubench/
#   bench/gpu_bench.sh run     # there: run(command="bench/gpu_bench.sh run", carry=[".gpubench"])
#
# Environment: STEPS (default 200) timed steps per training run, on top of WARMUP (default 20).
# The premise of the training table, checked on each long run's trace after timing (`ampscope report --json`; a
# broken one is written to the report and stderr as "gpu_bench: premise broken: expected X, found Y" and the script
# exits 1): the trace is complete with WARMUP + STEPS steps on device cuda, no op rows with --probe off and op rows
# with health and full. pytorch_bench.py checks its models trained on cuda to a finite loss.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bundle_dir=.gpubench

case "${1:-}" in
  pack)
    build=${BUILD:-/tmp/build-gpubench}
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAMPSCOPE_CUDA=ON -DAMPSCOPE_VIEWER=OFF \
      -DAMPSCOPE_BENCH=OFF
    cmake --build "$build" -j2 --target ampscope scaler_tests optim_tests probes_tests kernels_tests
    rm -rf "$bundle_dir" && mkdir -p "$bundle_dir"
    ../shared/tools/device-bundle.sh "$build" "$bundle_dir"
    grep -qx "/$bundle_dir/" .git/info/exclude 2>/dev/null || echo "/$bundle_dir/" >> .git/info/exclude
    ;;
  run)
    # The fused AMP kernels are opt-in until verified on a GPU; the benchmark times them (and, below, without).
    export AMPSCOPE_FUSED_AMP=1
    out=${OUT:-$bundle_dir/out}
    mkdir -p "$out"
    [ -d "$bundle_dir/bundle" ] || tar xzf "$bundle_dir/bundle.tar.gz" -C "$bundle_dir"
    export LD_LIBRARY_PATH="$root/$bundle_dir/bundle/lib:${LD_LIBRARY_PATH:-}"
    export AMPSCOPE_REQUIRE_GPU=1  # a GPU test that would skip fails instead
    bin=$bundle_dir/bundle/bin
    tests=$bin/tests
    ampscope=$bin/bin/ampscope
    report=$out/gpu_bench.md
    steps=${STEPS:-200} warmup=${WARMUP:-20}
    status=0
    {
      echo "# gpu_bench: $(date -u '+%Y-%m-%d %H:%M UTC')"
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
      echo
    } > "$report"

    # 1. The CUDA tests: the fast path's own, then the backend's parity suite.
    echo "## CUDA tests" >> "$report"
    for spec in "scaler_tests:fused_*" "optim_tests:fused_*" "probes_tests:stats_cuda_test.*" "kernels_tests:cuda_*"; do
      prog=${spec%%:*} filter=${spec#*:}
      log="$out/test-$prog.txt"
      if "$tests/$prog" --gtest_brief=1 --gtest_filter="$filter" > "$log" 2>&1; then
        echo "- $prog ($filter): passed" >> "$report"
      else
        echo "- $prog ($filter): FAILED (see $(basename "$log"))" >> "$report"
        status=1
      fi
    done

    # 2. Statistics kernel GB/s against a device-to-device copy, and 4. matrix products, measured in the
    # same run by the disabled gpu_timing tests.
    echo -e "\n## statistics kernel against a device copy, and ampscope matrix products" >> "$report"
    "$tests/probes_tests" --gtest_also_run_disabled_tests --gtest_filter='gpu_timing.*' 2>&1 |
      tee "$out/timing.txt" | grep '^|' >> "$report" || status=1

    # 3. Probe overhead and training step per sample: `ampscope train` timed at two step counts, so the
    # start-up (CUDA context, cuBLAS handle, trace file) cancels: ms/step = (t(warmup+steps) - t(warmup)) / steps.
    run_ms() {  # run_ms LABEL ARGS... -> prints wall milliseconds of one run
      local t0 t1
      t0=$(date +%s%N)
      "$ampscope" train --overwrite "$@" > "$out/train-$1.log" 2>&1 || { echo "train failed: $*" >&2; return 1; }
      t1=$(date +%s%N)
      echo $(( (t1 - t0) / 1000000 ))
    }
    per_step() {  # per_step LABEL ARGS...
      local label=$1; shift
      local short long
      short=$(run_ms "$label-short" --steps "$warmup" "$@") || return 1
      long=$(run_ms "$label-long" --steps $((warmup + steps)) "$@") || return 1
      awk -v a="$short" -v b="$long" -v n="$steps" 'BEGIN { printf "%.3f", (b - a) / n }'
    }
    echo -e "\n## ampscope training step (fp16: autocast + GradScaler, AdamW, clip 1.0) and probe overhead" >> "$report"
    echo "| sample | ms/step probes off | off, unfused AMP | health | full | health/off | full/off |" >> "$report"
    echo "|---|---|---|---|---|---|---|" >> "$report"
    for sample in mlp cnn transformer; do
      common=(--sample "$sample" --precision fp16 --device cuda --seed 1)
      off=$(per_step "$sample-off" "${common[@]}" --probe off --out "$out/$sample-off.h5") || { status=1; continue; }
      unfused=$(AMPSCOPE_FUSED_AMP=0 per_step "$sample-unfused" "${common[@]}" --probe off --out "$out/$sample-unfused.h5") || status=1
      health=$(per_step "$sample-health" "${common[@]}" --probe health --out "$out/$sample-health.h5") || status=1
      full=$(per_step "$sample-full" "${common[@]}" --probe full --out "$out/$sample-full.h5") || status=1
      for level in off unfused health full; do
        [[ -f $out/$sample-$level.h5 ]] || continue
        if ! "$ampscope" report --json "$out/$sample-$level.h5" 2>/dev/null |
          python3 -c 'import json, sys
d, want, level = json.load(sys.stdin), int(sys.argv[1]), sys.argv[2]
ops_ok = d["op_rows"] == 0 if level in ("off", "unfused") else d["op_rows"] > 0
if not (d["complete"] and d["steps"] == want and d["run"]["device"] == "cuda" and ops_ok):
    sys.exit("gpu_bench: premise broken: expected %s: a complete trace of %d steps on cuda, %s, found complete %s, "
             "%d steps on %s, %d op rows" % (sys.argv[3], want, "no op rows" if level in ("off", "unfused") else
             "op rows", d["complete"], d["steps"], d["run"]["device"], d["op_rows"]))' \
            $((warmup + steps)) "$level" "$sample-$level" 2>&1 | tee -a "$report" >&2; then
          status=1
        fi
      done
      ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
      echo "| $sample | $off | ${unfused:-} | ${health:-} | ${full:-} | $(ratio "${health:-0}" "$off") | $(ratio "${full:-0}" "$off") |" >> "$report"
      rm -f "$out"/*.h5  # traces are large and not needed back
    done

    # 5. PyTorch eager on the same models and products.
    echo -e "\n## PyTorch eager (bench/pytorch_bench.py)" >> "$report"
    python3 bench/pytorch_bench.py --steps "$steps" --warmup "$warmup" > "$out/pytorch.txt" 2>&1 || status=1
    cat "$out/pytorch.txt" >> "$report"

    cat "$report"
    exit $status
    ;;
  *)
    echo "usage: $0 pack|run   (see the comment at the top of this script)" >&2
    exit 2
    ;;
esac
