#!/usr/bin/env bash
# Runs on the GPU machine (H200): builds everything that builds there, runs every test (GPU tests included)
# and every benchmark, and prints a short table last. Logs go to $OUT (or ./gpu-out) for the record.
#   usage: scripts/gpu-check.sh [--tests-only | --bench-only | --engine-only | --serve-only] [bench-name-filter]
#   env:   PREBUILT=1 (carried binaries: scripts/gpu-bins.sh), GTEST_FILTER (tests), KERNEL_TEST_SHARDS (default 3),
#          BENCH_ARGS (extra args for every *_bench), ENGINE_BENCH_ARGS (bench-engine args)
#          ENGINE_QUANT (bench-engine configs: none fp8 fp8all by default; also fp8split, fp8nopdl)
#          SERVE_QUANT (none | fp8, default fp8), SERVE_CONCURRENCY (default 1,2,4,8,16,32,64), SERVE_PRESET
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-/tmp/ds-build-gpu}
mode=${1:-all}
filter=${2:-}
export NCCL_NVLS_ENABLE=0  # never NVLink multicast on the shared hosts

t0=$(date +%s)
# PREBUILT=1: the binaries built on the development machine (scripts/gpu-bins.sh pack; carry gpu-bins), which
# saves the build; core_tests (Device.* needs the card), kernels_tests and runtime_tests travel (the CPU-only test
# binaries run in CI). A carried set that does not start here falls back to building.
if [ "${PREBUILT:-0}" = 1 ] && scripts/gpu-bins.sh unpack "$BUILD"; then
  export LD_LIBRARY_PATH="$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "build: carried binaries ($(( $(date +%s) - t0 )) s)"
else
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDELTASERVE_FUZZ=OFF >"$OUT/configure.log" 2>&1 \
    || { tail -30 "$OUT/configure.log"; exit 1; }
  ninja -C "$BUILD" >"$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"

declare -A status
if [ "$mode" = all ] || [ "$mode" = --tests-only ]; then
  for t in "$BUILD"/tests/*_tests; do
    name=$(basename "$t")
    # kernels_tests (~310 s serially on an H100, most of a device call) runs as KERNEL_TEST_SHARDS gtest shards side
    # by side: its tests are independent of each other and of timing. The other binaries hold engine tests that
    # size their pools by the free GPU memory, so they run alone.
    shards=1
    [ "$name" = kernels_tests ] && shards=${KERNEL_TEST_SHARDS:-3}
    pids=()
    for ((i = 0; i < shards; ++i)); do
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout 400 "$t" \
        ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$OUT/$name.$i.log" 2>&1 &
      pids+=($!)
    done
    status[$name]=PASS
    for p in "${pids[@]}"; do wait "$p" || status[$name]=FAIL; done
    cat "$OUT/$name".*.log > "$OUT/$name.log" && rm -f "$OUT/$name".*.log
    grep -E "FAILED|Failure|Timeout|Segmentation|Aborted" "$OUT/$name.log" | head -30
    # The slowest tests, for whoever trims the suite's device time next.
    sed -n 's/^\[       OK \] \(.*\) (\([0-9]*\) ms)$/\2 \1/p' "$OUT/$name.log" | sort -rn | head -5 |
      awk -v n="$name" '{printf "slowest %s: %s %.1f s\n", n, $2, $1 / 1000}'
  done
fi
if [ "$mode" = all ] || [ "$mode" = --bench-only ]; then
  for b in "$BUILD"/bench/*_bench; do
    name=$(basename "$b")
    [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
    if timeout 300 "$b" ${BENCH_ARGS:-} >"$OUT/$name.log" 2>&1; then status[$name]=DONE; else status[$name]=FAIL; fi
  done
fi
# The end-to-end engine benchmark on the full-size random-weight model (bf16, FP8, and FP8 with every projection
# in FP8: the target row's weights, DELTASERVE_FP8_KDA_PROJ=1 and DELTASERVE_FP8_LM_HEAD=1), unless tests-only.
if [ "$mode" = "--engine-only" ] || [ "$mode" = "all" ]; then
  for q in ${ENGINE_QUANT:-none fp8 fp8all}; do
    name=bench_engine_$q
    knobs=()
    quant=$q
    if [ "$q" = fp8all ]; then knobs=(DELTASERVE_FP8_KDA_PROJ=1 DELTASERVE_FP8_LM_HEAD=1); quant=fp8; fi
    # On request (ENGINE_QUANT): the split KDA projection, and FP8 without PDL (what the overlap buys).
    if [ "$q" = fp8split ]; then knobs=(DELTASERVE_FP8_KDA_PROJ=2); quant=fp8; fi
    if [ "$q" = fp8nopdl ]; then knobs=(DELTASERVE_PDL=0); quant=fp8; fi
    if env "${knobs[@]}" timeout ${ENGINE_TIMEOUT:-420} "$BUILD/src/deltaserve" bench-engine --random-weights --preset kimi-linear-48b-a3b --quantize $quant \
        ${ENGINE_BENCH_ARGS:---breakdown} --md "$OUT/$name.md" --json "$OUT/$name.json" >"$OUT/$name.log" 2>&1; then
      status[$name]=DONE
    else
      status[$name]=FAIL
    fi
  done
fi

# Server overhead (targets.md): deltaserve bench against deltaserve serve on the full-size random-weight model;
# the report's "TPOT / step" column is TPOT p50 over the engine's own mean decode step (from /metrics).
if [ "$mode" = "--serve-only" ] || [ "$mode" = "all" ]; then
  name=serve_bench_${SERVE_QUANT:-fp8}
  if ! "$BUILD/src/deltaserve" serve --help >/dev/null 2>&1; then
    echo "$name: this deltaserve has no serve subcommand (built without cpp-httplib/PCRE2: use PREBUILT=1)"
    status[$name]=SKIP
  else
    "$BUILD/src/deltaserve" serve --random-weights --preset "${SERVE_PRESET:-kimi-linear-48b-a3b}" --quantize "${SERVE_QUANT:-fp8}" \
      --port 0 --max-concurrent 64 >"$OUT/$name.serve.log" 2>&1 &
    spid=$!
    port=""
    for _ in $(seq 1 300); do  # the first stderr line names the port once the model is built
      port=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/$name.serve.log" | head -1 | sed 's/.*://')
      [ -n "$port" ] && break
      kill -0 $spid 2>/dev/null || break
      sleep 1
    done
    if [ -n "$port" ] && timeout ${SERVE_TIMEOUT:-420} "$BUILD/src/deltaserve" bench --base-url "http://127.0.0.1:$port" \
        --concurrency "${SERVE_CONCURRENCY:-1,2,4,8,16,32,64}" --input-len 1024 --output-len 128 --ignore-eos \
        --token-ids 1:255 --requests-per-user 2 --out-md "$OUT/$name.md" --out-json "$OUT/$name.json" \
        >"$OUT/$name.log" 2>&1; then
      status[$name]=DONE
    else
      status[$name]=FAIL
      tail -5 "$OUT/$name.serve.log"
    fi
    kill -TERM $spid 2>/dev/null
    wait $spid 2>/dev/null
  fi
fi

echo
echo "==================== summary ($(( $(date +%s) - t0 )) s) ===================="
for k in "${!status[@]}"; do printf '%-28s %s\n' "$k" "${status[$k]}"; done | sort
for f in "$OUT"/*_bench.log "$OUT"/bench_engine_*.log; do
  [ -f "$f" ] || continue
  echo "---- $(basename "$f" .log) (last lines)"
  tail -n 30 "$f"
done
for f in "$OUT"/serve_bench_*.md; do
  [ -f "$f" ] || continue
  echo "---- $(basename "$f" .md) (sweep table)"
  sed -n '/^| c | repeat/,/^$/p' "$f"
done
