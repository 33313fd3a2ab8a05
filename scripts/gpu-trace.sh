#!/usr/bin/env bash
# Kernel timeline of the engine's decode step on the GPU machine: bench-engine (48B random weights) under the
# CUPTI tracer (tools/ktrace), summarised per kernel by scripts/ktrace_summary.py. A run without the tracer goes
# first, so the tracer's own cost shows.
#   usage: OUT=... scripts/gpu-trace.sh 'name:quant[:ENV=V,ENV=V[:extra bench-engine arguments]]' ...
#          e.g. scripts/gpu-trace.sh fp8:fp8 bf16:none 'fp8-kda8:fp8:DELTASERVE_FP8_KDA_PROJ=1' \
#               'fp8-noproj:fp8::--ablate kda.proj'
#   env:   PREBUILT=1 (binaries already unpacked by scripts/gpu-bins.sh into BUILD_DIR), TRACE_ARGS (bench-engine arguments; default C = 1, input 1024, output 64), BUILD_DIR,
#          TRACE_PLAIN=0 (skip the run without the tracer)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD_DIR:-/tmp/ds-build-gpu}
mkdir -p "$OUT"
if [ "${PREBUILT:-0}" = 1 ] && [ -x "$BUILD/src/deltaserve" ] && [ -f "$BUILD/tools/ktrace/libds_ktrace.so" ]; then
  export LD_LIBRARY_PATH="$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # carried (scripts/gpu-bins.sh unpack)
else
  [ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDELTASERVE_FUZZ=OFF \
    >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  ninja -C "$BUILD" deltaserve ds_ktrace >"$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
fi
args=${TRACE_ARGS:---concurrency 1 --input-len 1024 --output-len 64}
for spec in "$@"; do
  name=${spec%%:*}
  rest=${spec#*:}
  q=${rest%%:*}
  envs=""
  extra=""
  if [[ "$rest" == *:* ]]; then
    rest=${rest#*:}
    envs=${rest%%:*}
    [[ "$rest" == *:* ]] && extra=${rest#*:}
  fi
  run=(env ${envs//,/ } "$BUILD/src/deltaserve" bench-engine --random-weights --preset kimi-linear-48b-a3b --quantize "$q" $args $extra)
  echo "==== $name: ${run[*]:1}"
  if [ "${TRACE_PLAIN:-1}" != 0 ]; then
    timeout 300 "${run[@]}" >"$OUT/trace_$name.plain.log" 2>&1
    grep -m1 -E "^concurrency .*tps/user" "$OUT/trace_$name.plain.log" | sed 's/^/untraced: /'
  fi
  CUDA_INJECTION64_PATH="$BUILD/tools/ktrace/libds_ktrace.so" DS_KTRACE_OUT="$OUT/trace_$name.csv" \
    timeout 300 "${run[@]}" >"$OUT/trace_$name.log" 2>&1
  grep -m1 -E "^concurrency .*tps/user" "$OUT/trace_$name.log" | sed 's/^/traced:   /'
  grep "^ktrace:" "$OUT/trace_$name.log"
  python3 scripts/ktrace_summary.py "$OUT/trace_$name.csv" --nodes "$OUT/trace_${name}_nodes.md" \
    >"$OUT/trace_$name.md" && head -40 "$OUT/trace_$name.md"
  gzip -f "$OUT/trace_$name.csv"
done
