#!/usr/bin/env bash
# Builds, tests and benchmarks the KDA kernels on the GPU machine in one call; logs go to $OUT (the device
# tool returns them) and a short summary ends the output. Each KDA test runs in its own process so a crash
# in one kernel cannot hide the results of the others; a failing test is re-run under compute-sanitizer.
#
# From the development machine (see docs/perf.md):
#   rm -rf /work/main/.gpu/kda && mkdir -p /work/main/.gpu/kda && \
#     git ls-files -z | xargs -0 cp --parents -t /work/main/.gpu/kda
#   run(carry=[".gpu/kda"], command="cd .gpu/kda && scripts/gpu-kda.sh")
# Arguments are passed to kda_bench (e.g. --quick, --decode-only); SKIP_BENCH=1 runs the tests only.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kda-out}
B=${BUILD_DIR:-/tmp/kda-build}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
  | tee "$OUT/gpu.txt"
git_rev=$(cat .git-rev 2>/dev/null || echo unknown)
echo "commit: $git_rev" | tee -a "$OUT/gpu.txt"

if ! { cmake -S . -B "$B" -G Ninja -DDELTASERVE_FUZZ=OFF -DCMAKE_BUILD_TYPE=Release >/tmp/kda-cmake.log 2>&1 &&
       ninja -C "$B" kernels_tests kda_bench >"$OUT/build.log" 2>&1; }; then
  tail -20 /tmp/kda-cmake.log
  tail -40 "$OUT/build.log"
  exit 1
fi

failed=()
for t in $("$B/tests/kernels_tests" --gtest_list_tests --gtest_filter='Kda*' | awk '/^[^ ]/{s=$1} /^  /{print s $1}'); do
  if ! "$B/tests/kernels_tests" --gtest_filter="$t" >"/tmp/kda-test_$t.log" 2>&1; then failed+=("$t"); fi
  cat "/tmp/kda-test_$t.log" >>"$OUT/tests.log"
done
# Error figures: the 12 largest RMS ratios and anything with NaNs (all lines are in tests.log).
grep -E '^\[err\]' "$OUT/tests.log" | awk '{r=$0; sub(/.*rms_ratio=/, "", r); sub(/ .*/, "", r); print r "\t" $0}' \
  | sort -g -r | head -12 | cut -f2- | cut -c1-118
grep -E '^\[err\].*nan=[1-9]' "$OUT/tests.log" | head -5
echo "KDA [err] lines: $(grep -c '^\[err\]' "$OUT/tests.log")"
echo "KDA tests failed: ${#failed[@]} ${failed[*]:-}"
for t in "${failed[@]:0:3}"; do
  grep -E 'Failure|Expected|Which is|error|rms_ratio' "/tmp/kda-test_$t.log" | head -12
  if command -v compute-sanitizer >/dev/null; then
    timeout 120 compute-sanitizer --print-limit 5 "$B/tests/kernels_tests" --gtest_filter="$t" 2>&1 \
      | grep -E '=====|Invalid|at |by thread' | head -20
  fi
done

# PROFILE=1: Nsight Compute on the first prefill shape's two kernels (clocks left alone).
if [ "${PROFILE:-0}" = 1 ] && command -v ncu >/dev/null; then
  timeout 150 ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis -k regex:'kda_(intra|scan)' --launch-count 2 \
    "$B/bench/kda_bench" --prefill-only --quick >"$OUT/ncu.txt" 2>&1
  grep -E 'kda_(intra|scan)|Duration|Achieved Occupancy|Warp Cycles Per Issued|Compute \(SM\) Th|Memory Throughput|Registers Per|Block Limit (Sh|Reg)|cycles being stalled' "$OUT/ncu.txt" \
    | sed 's/^ *//' | cut -c1-200 | head -40
fi

[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
"$B/bench/kda_bench" "$@" >"$OUT/bench.log" 2>&1
rc=$?
sed -n '/# summary/,$p' "$OUT/bench.log"
[ $rc = 0 ] || tail -5 "$OUT/bench.log"
exit $rc
