#!/usr/bin/env bash
# The measurements owed to an H200 (the targets are judged there), in one device call, most important first:
# moe_bench's decode sweep, the KDA decode's in-place ceiling and its decode sweep, then the engine (FP8, and bf16
# where the card holds the bf16 48B model: about 96 GB, so an H200 only) at C = 1, 4, 16, 64, input 1024,
# output 128. Each step is skipped once the call has run too long for it; logs and tables go to $OUT.
#   usage (device call, carry gpu-bins): bash scripts/gpu-h200-list.sh    env: BUILD_DIR (default /tmp/ds-build-gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
B=${BUILD_DIR:-/tmp/ds-build-gpu}
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
scripts/gpu-bins.sh unpack "$B" || exit 1
export LD_LIBRARY_PATH=$B/lib
command -v nvidia-smi > /dev/null || { echo "gpu-h200-list: no GPU here" >&2; exit 1; }
gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)
echo "gpu: $gpu"
timeout 150 "$B/bench/moe_bench" --quick --decode > "$OUT/moe_decode.log" 2>&1; echo "moe_bench rc=$? at $(el) s"
timeout 40 "$B/bench/kda_bench" --rmw-ceiling > "$OUT/kda_rmw.log" 2>&1; echo "kda_bench rmw rc=$? at $(el) s"
timeout 90 "$B/bench/kda_bench" --decode-only --quick > "$OUT/kda_decode.log" 2>&1
echo "kda_bench decode rc=$? at $(el) s"
engine() {  # quant, seconds: gpu-check's engine run (bench_engine_QUANT.md in $OUT), on the binaries unpacked above
  ENGINE_QUANT=$1 ENGINE_TIMEOUT=$2 ENGINE_BENCH_ARGS="--concurrency 1,4,16,64 --input-len 1024 --output-len 128" \
    PREBUILT=1 BUILD_DIR="$B" OUT="$OUT" scripts/gpu-check.sh --engine-only > "$OUT/engine_$1.check.log" 2>&1
  echo "engine $1: $(grep -o "bench_engine_$1 *[A-Z]*" "$OUT/engine_$1.check.log") at $(el) s"
}
[ "$(el)" -lt 420 ] && engine fp8 150
[[ "$gpu" == *H200* ]] && [ "$(el)" -lt 450 ] && engine none $(( 580 - $(el) ))
echo "---- moe_bench --quick --decode"; grep -E "^\|" "$OUT/moe_decode.log" | head -60
echo "---- kda_bench --rmw-ceiling"; tail -12 "$OUT/kda_rmw.log"
echo "---- kda_bench --decode-only --quick"; grep -E "^\|" "$OUT/kda_decode.log" | head -30
for q in fp8 none; do
  [ -f "$OUT/bench_engine_$q.md" ] && { echo "---- engine $q"; cat "$OUT/bench_engine_$q.md"; }
done
echo "done at $(el) s"
