#!/usr/bin/env bash
# One GPU-machine pass for the MLA/GEMM/norm/embedding/sampling kernels: build (or use binaries built on the
# development machine, put in prebuilt/), run their tests and both benchmarks, keep the logs in $OUT, print a
# short summary last. Usage on the device machine: scripts/gpu-mla.sh   (from the repository root)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-mla-out}
mkdir -p "$OUT"
if [ -x prebuilt/kernels_tests ]; then
  BIN=prebuilt
else
  BIN=/tmp/gpu-mla-build
  cmake -S . -B "$BIN" -G Ninja -DDELTASERVE_FUZZ=OFF >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  ninja -C "$BIN" kernels_tests mla_bench gemm_bench >"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
  BIN="$BIN"
  mv "$BIN/tests/kernels_tests" "$BIN/bench/mla_bench" "$BIN/bench/gemm_bench" "$BIN/" 2>/dev/null
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
# One process per test: a crash or hang in one kernel cannot hide the results of the others.
FILTER='*Mla*:*Gemm*:*Norm*:*Sampl*:*Embed*'
TEST_RC=0
: >"$OUT/tests.log"
for t in $("$BIN/kernels_tests" --gtest_filter="$FILTER" --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}'); do
  timeout 300 "$BIN/kernels_tests" --gtest_filter="$t" >>"$OUT/tests.log" 2>&1 || { TEST_RC=1; echo "[  FAILED  ] $t (rc $?)" >>"$OUT/tests.log"; }
done
"$BIN/mla_bench" >"$OUT/mla_bench.log" 2>&1
"$BIN/gemm_bench" >"$OUT/gemm_bench.log" 2>&1
echo "==== errors ([err]/[probe] lines)"
grep -E '^\[(err|probe)\]' "$OUT/tests.log" | cut -c1-400
echo "==== test verdicts (rc $TEST_RC)"
echo "OK: $(grep -c '^\[       OK \]' "$OUT/tests.log")  SKIPPED: $(grep -c '^\[  SKIPPED \] [A-Z].*ms)' "$OUT/tests.log")"
grep '^\[  FAILED  \] [A-Z]' "$OUT/tests.log" | sort -u
grep -A6 'Failure$' "$OUT/tests.log" | cut -c1-200 | head -60
echo "==== mla_bench"
cat "$OUT/mla_bench.log"
echo "==== gemm_bench"
cat "$OUT/gemm_bench.log"
