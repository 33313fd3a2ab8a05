#!/usr/bin/env bash
# Hardware counters for the decode kernels that set the step time (run on the GPU machine; needs its Firecracker
# runtime, where ncu reads counters: .library/device/KINDS.md). Clocks stay as they are (--clock-control none).
# Profiles a few launches of: the W8A16 and bf16 decode GEMV on the KDA projection shape (gemm_bench), and the
# one-token MoE kernels (router, top-k, gemv up/down; moe_bench --t1). One text report per target under $OUT.
#   usage: OUT=... scripts/gpu-ncu.sh [gemv-shape]      (default kda_qkvfbg)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD_DIR:-/tmp/ds-build-gpu}
shape=${1:-kda_qkvfbg}
mkdir -p "$OUT"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDELTASERVE_FUZZ=OFF >"$OUT/ncu_configure.log" 2>&1 &&
  ninja -C "$BUILD" gemm_bench moe_bench >"$OUT/ncu_build.log" 2>&1 || { tail -30 "$OUT/ncu_build.log"; exit 1; }
sections=(--section SpeedOfLight --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis
          --section MemoryWorkloadAnalysis --section WarpStateStats --section InstructionStats --section SchedulerStats)
# Skip the warm-up launches; three of each kernel are enough (the reports are per launch).
timeout 240 ncu --clock-control none --kernel-name regex:'gemv_kernel' --launch-skip 40 --launch-count 3 \
  "${sections[@]}" "$BUILD/bench/gemm_bench" --gemv "$shape" >"$OUT/ncu_gemv.txt" 2>&1 || echo "ncu gemv rc=$?"
timeout 240 ncu --clock-control none --kernel-name regex:'gemv_up_kernel|gemv_down_kernel|topk_kernel|router_logits' \
  --launch-skip 200 --launch-count 8 "${sections[@]}" "$BUILD/bench/moe_bench" --quick --t1 >"$OUT/ncu_moe.txt" 2>&1 ||
  echo "ncu moe rc=$?"
# The lines that answer "what limits it": throughput vs peak, issue activity, pipe use and the top stall reasons.
grep -h -E "^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc|Achieved Occupancy|Registers Per|Stall|One or More Eligible|No Eligible" \
  "$OUT"/ncu_gemv.txt "$OUT"/ncu_moe.txt | head -200 >"$OUT/ncu_summary.txt"
cat "$OUT/ncu_summary.txt" | head -80
