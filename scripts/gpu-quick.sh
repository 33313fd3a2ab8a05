#!/usr/bin/env bash
# One device call's worth of checks, results trimmed to the few files the device tool brings back:
# every test binary, the named benchmarks (pattern), and bench-engine at a few concurrencies (bf16 + FP8).
#   usage: OUT=... scripts/gpu-quick.sh [bench-pattern] [engine-concurrency]
#   e.g.   ARGS_moe_bench='--quick --decode' scripts/gpu-quick.sh 'mla|moe' 1,4
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-$PWD/gpu-out}
RAW=/tmp/gpu-raw
rm -rf "$RAW" && mkdir -p "$RAW" "$FINAL"
benches=${1:-}
conc=${2:-1,4}
OUT=$RAW scripts/gpu-check.sh --tests-only > "$FINAL/summary.txt" 2>&1
grep -h "^\[  FAILED  \]" "$RAW"/*_tests.log | sort -u > "$FINAL/failed_tests.txt"  # names first: never truncated
for f in "$RAW"/*_tests.log; do
  grep -q -E "FAILED|Failure|Segmentation|Aborted" "$f" && { echo "==== $f"; grep -E -B3 -A25 "Failure|FAILED|Segmentation|Aborted" "$f" | head -200; }
done > "$FINAL/failures.txt"
grep -h "^\[err\]" "$RAW"/*_tests.log > "$FINAL/err_stats.txt"
if [ -n "$benches" ]; then
  for b in /tmp/ds-build-gpu/bench/*_bench; do
    n=$(basename "$b")
    [[ "$n" =~ $benches ]] || continue
    args_var="ARGS_$n"  # per-benchmark arguments, e.g. ARGS_moe_bench="--quick --decode"
    timeout 300 "$b" ${!args_var:-} > "$FINAL/$n.log" 2>&1 || echo "$n FAILED rc=$?" >> "$FINAL/summary.txt"
  done
fi
if [ "$conc" != "none" ]; then
  OUT=$RAW ENGINE_BENCH_ARGS="--breakdown --concurrency $conc --output-len ${ENGINE_OUTPUT_LEN:-128}" ENGINE_TIMEOUT=240 \
    scripts/gpu-check.sh --engine-only >> "$FINAL/summary.txt" 2>&1
  cat "$RAW"/bench_engine_*.md > "$FINAL/bench_engine.md" 2>/dev/null
  grep -h "concurrency\|weights" "$RAW"/bench_engine_*.log >> "$FINAL/bench_engine.md" 2>/dev/null
fi
grep -A12 "==== summary" "$FINAL/summary.txt" | head -20
