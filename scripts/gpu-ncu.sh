#!/usr/bin/env bash
# Hardware counters for the decode kernels that set the step time (run on the GPU machine; needs its Firecracker
# runtime, where ncu reads counters: .library/device/KINDS.md). Clocks stay as they are (--clock-control none).
# Profiles a few launches of: the W8A16 and bf16 decode GEMV on the KDA projection shape (gemm_bench), and the
# one-token MoE kernels (router, top-k, gemv up/down; moe_bench --t1). One text report per target under $OUT.
#   usage: OUT=... scripts/gpu-ncu.sh [gemv-shape]      (default kda_qkvfbg)
#          OUT=... scripts/gpu-ncu.sh kda                the KDA chunked-prefill kernels instead (8192 x 1, H = 32):
#          the intra kernel and the 4 x 3 scan, with warp-stall samples per SASS line summarised per region by
#          scripts/ncu_regions.py (the intra kernel's phases are its clock reads; the scan's regions its barriers)
#          OUT=... scripts/gpu-ncu.sh moe-prefill        the FP8 MoE prefill GEMMs (T = 16384, Kimi shape) with
#          the hottest SASS lines (scripts/ncu_regions.py --lines)
#          OUT=... scripts/gpu-ncu.sh moe-decode         the MoE stream GEMMs of decode (graph-replayed, Kimi shape):
#          FP8 at T = 64 (the engine's C = 64 step) and MXFP4 at T = 2, 2 token tiles, with the hottest SASS lines
#   PREBUILT=1: use the binaries already in BUILD_DIR (scripts/gpu-bins.sh unpack) instead of building there.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD_DIR:-/tmp/ds-build-gpu}
shape=${1:-kda_qkvfbg}
mkdir -p "$OUT"
if [ "${PREBUILT:-0}" != 1 ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDELTASERVE_FUZZ=OFF >"$OUT/ncu_configure.log" 2>&1 &&
    ninja -C "$BUILD" gemm_bench moe_bench kda_bench >"$OUT/ncu_build.log" 2>&1 || { tail -30 "$OUT/ncu_build.log"; exit 1; }
fi
if [ "$shape" = moe-prefill ]; then
  # GEMM1 and GEMM2 of the first timed call (after the warm-up call): warp state, throughputs and the hottest
  # SASS lines by stall samples (the two kernels' source tables read as one: a line's address tells them apart).
  rep="$OUT/ncu_moe_fp8"
  timeout 200 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:wgmma_fp8_(ws_)?kernel" \
    --launch-skip 2 --launch-count 2 --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters \
    -o "$rep" -f "$BUILD/bench/moe_bench" --quick --prefill --tokens 16384 >"$rep.log" 2>&1 || echo "ncu moe fp8 rc=$?"
  ncu -i "$rep.ncu-rep" --print-details all >"$rep.txt" 2>&1
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.csv" 2>&1
  gzip -f "$rep.csv"
  grep -E "Duration|Compute \(SM\) Throughput|L2 Cache Throughput|Issue Slots Busy|Tensor Cycles Active|Warp Cycles Per Issued" \
    "$rep.txt" | sed 's/^ *//' | cut -c1-120 | head -16
  python3 scripts/ncu_regions.py "$rep.csv.gz" --lines 25 --top 3
  exit 0
fi
if [ "$shape" = moe-decode ]; then
  # GEMM1 and GEMM2 of one replay after the sweep's warm-up (moe_bench --tiles at one T: tiles 1, 2, 4, 8 per round;
  # the regex keeps the 2-tile instances, whose first two launches are the warm-up).
  for k in fp8:FmtFP8:64:fp8-block mxfp4:FmtMXFP4:2:mxfp4; do
    IFS=: read -r name fmt t format <<<"$k"
    rep="$OUT/ncu_moe_stream_$name"
    timeout 200 ncu --clock-control none --kernel-name-base demangled \
      --kernel-name "regex:stream_gemm_kernel<ds::moe::detail::$fmt, \(int\)2" --launch-skip 2 --launch-count 2 \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats --section SourceCounters \
      -o "$rep" -f "$BUILD/bench/moe_bench" --tiles --tokens "$t" --format "$format" >"$rep.log" 2>&1 ||
      echo "ncu moe $name rc=$?"
    ncu -i "$rep.ncu-rep" --print-details all >"$rep.txt" 2>&1
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.csv" 2>&1
    gzip -f "$rep.csv"
    echo "== $name T = $t"
    grep -E "stream_gemm_kernel|Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|No Eligible|Grid Size" \
      "$rep.txt" | sed 's/^ *//' | cut -c1-120 | head -30
    python3 scripts/ncu_regions.py "$rep.csv.gz" --lines 20 --top 3
  done
  exit 0
fi
if [ "$shape" = kda ]; then
  # One launch of each after two warm-up runs of the first prefill shape; the source page as CSV for the summary.
  # The demangled scan name spells its template arguments with casts: kda_scan_kernel<(int)3, (int)32, (bool)1>.
  for k in intra:kda_intra_kernel:clock scan:'kda_scan_kernel<\(int\)3, \(int\)32':bar; do
    IFS=: read -r name re split <<<"$k"
    timeout 200 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:$re" --launch-skip 2 \
      --launch-count 1 --section WarpStateStats --section SchedulerStats --section SourceCounters \
      --section MemoryWorkloadAnalysis -o "$OUT/ncu_kda_$name" -f "$BUILD/bench/kda_bench" --prefill-only --quick \
      >"$OUT/ncu_kda_$name.log" 2>&1 || echo "ncu kda $name rc=$?"
    ncu -i "$OUT/ncu_kda_$name.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_kda_$name.csv" 2>&1
    echo "== $name (regions split at $split)"
    python3 scripts/ncu_regions.py "$OUT/ncu_kda_$name.csv" --split "$split" | tee "$OUT/ncu_kda_${name}_regions.txt"
  done
  exit 0
fi
sections=(--section SpeedOfLight --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis
          --section MemoryWorkloadAnalysis --section WarpStateStats --section InstructionStats --section SchedulerStats
          --section SourceCounters)
# Skip the warm-up launches; a few of each kernel are enough (the reports are per launch). Names are matched on the
# demangled signature, which spells template arguments "(int)1, (bool)1", so they pick the variant (the W8A16 kernel at
# M = 1; the MoE kernels with FP8 experts).
prof() {  # name regex, skip, count, report, command...
  local re=$1 skip=$2 count=$3 rep=$4
  shift 4
  timeout 200 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:$re" --launch-skip "$skip" \
    --launch-count "$count" "${sections[@]}" "$@" >"$OUT/$rep" 2>&1 || echo "ncu $rep rc=$?"
}
prof 'gemv_kernel<\(int\)1, \(bool\)1' 40 3 ncu_gemv.txt "$BUILD/bench/gemm_bench" --gemv "$shape"
prof 'gemv_(up|down)_kernel<\(bool\)1' 20 4 ncu_moe.txt "$BUILD/bench/moe_bench" --quick --t1
prof 'topk_kernel|router_logits' 40 4 ncu_route.txt "$BUILD/bench/moe_bench" --quick --t1
# The lines that answer "what limits it": throughput vs peak, issue activity, pipe use and the top stall reasons.
grep -h -E "^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc|Achieved Occupancy|Registers Per|Stall|One or More Eligible|No Eligible" \
  "$OUT"/ncu_gemv.txt "$OUT"/ncu_moe.txt "$OUT"/ncu_route.txt | head -240 >"$OUT/ncu_summary.txt"
head -80 "$OUT/ncu_summary.txt"
