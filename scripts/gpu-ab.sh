#!/usr/bin/env bash
# A/B of engine knobs on the GPU machine: bench-engine (48B random weights) once per variant, one table.
# Assumes scripts/gpu-check.sh (or gpu-quick.sh) already built /tmp/ds-build-gpu.
#   usage: OUT=... scripts/gpu-ab.sh 'base:' 'cluster:DELTASERVE_MOE_CLUSTER_ROUTE=1' 'no-moe::--ablate moe' ...
#          (NAME:ENV=V,ENV=V[:extra bench-engine arguments])
#   env:   AB_QUANT (default "fp8 none"), AB_ARGS (bench-engine args; default C = 1, output 128, breakdown)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD_DIR:-/tmp/ds-build-gpu}
mkdir -p "$OUT"
table="$OUT/ab.md"
echo "| variant | quant | result |" >> "$table"
echo "|---|---|---|" >> "$table"
for spec in "$@"; do
  name=${spec%%:*}
  rest=${spec#*:}
  envs=${rest%%:*}
  extra=""
  [[ "$rest" == *:* ]] && extra=${rest#*:}
  for q in ${AB_QUANT:-fp8 none}; do
    log="$OUT/ab_${name}_$q.log"
    # The variant's knobs only for this process: env(1) with the comma-separated list.
    env ${envs//,/ } timeout ${AB_TIMEOUT:-200} "$BUILD/src/deltaserve" bench-engine --random-weights \
      --preset kimi-linear-48b-a3b --quantize $q ${AB_ARGS:---breakdown --concurrency 1 --output-len 128} $extra \
      > "$log" 2>&1 || echo "| $name | $q | FAILED rc=$? |" >> "$table"
    line=$(grep -m1 -E "^concurrency .*tps/user" "$log" | tr -s ' ')
    echo "| $name | $q | ${line:-see log} |" >> "$table"
  done
done
# Few files come back from the device machine: one log with every variant's output.
for f in "$OUT"/ab_*.log; do echo "==== $(basename "$f")"; cat "$f"; done > "$OUT/ab_all.txt" && rm -f "$OUT"/ab_*.log
cat "$table"
