#!/usr/bin/env bash
# MoE on the GPU machine in one call: build (or use prebuilt binaries), run the MoE tests and the benchmark,
# keep full logs under $OUT and print a short summary last.
#   scripts/gpu-moe.sh                 build in /tmp/b (16 cores there), then test + bench
#   scripts/gpu-moe.sh BIN_DIR         use BIN_DIR/kernels_tests and BIN_DIR/moe_bench (built elsewhere)
#   BENCH_ARGS=--quick                 Kimi shape only;  TEST_FILTER='Moe*' by default
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/moe-out}
mkdir -p "$OUT"
if [ $# -ge 1 ]; then
  TESTS=$1/kernels_tests
  BENCH=$1/moe_bench
else
  cmake -S . -B /tmp/b -G Ninja -DDELTASERVE_FUZZ=OFF -DDELTASERVE_SERVER=OFF >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  ninja -C /tmp/b kernels_tests moe_bench >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
  TESTS=/tmp/b/tests/kernels_tests
  BENCH=/tmp/b/bench/moe_bench
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
timeout ${TEST_TIMEOUT:-150} "$TESTS" --gtest_filter="${TEST_FILTER:-Moe*}" >"$OUT/tests.log" 2>&1
echo "tests exit: $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]" "$OUT/tests.log" | tail -15
grep -B2 -A6 "Failure" "$OUT/tests.log" | head -80
grep -E "^\[err\]" "$OUT/tests.log" | awk '{print $(NF-1), $0}' | sort -t= -k2 -g -r | head -12 | cut -d' ' -f2-
echo "[err] lines: $(grep -c '^\[err\]' "$OUT/tests.log")"
timeout ${BENCH_TIMEOUT:-200} "$BENCH" ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
echo "bench exit: $?"
cat "$OUT/bench.log"
