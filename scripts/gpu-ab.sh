#!/usr/bin/env bash
# A/B of engine variants on the GPU machine: bench-engine (48B random weights), the variants ALTERNATED for
# AB_ROUNDS rounds in one call, then one table of every run, the median per variant and concurrency and its change
# against the first variant. Run-to-run drift between device calls is 2-3 % on the H200 (docs/perf-engine.md, eleventh
# session), as large as the effects measured, so only variants alternated in one call compare.
# Assumes scripts/gpu-check.sh (or gpu-quick.sh) already built /tmp/ds-build-gpu.
#   usage: OUT=... scripts/gpu-ab.sh 'base:' 'preload0:DELTASERVE_MOE_DOWN_PRELOAD=0' 'no-moe::--ablate moe' ...
#          (NAME:ENV=V,ENV=V[:extra bench-engine arguments]; DS_BIN=/path among the ENVs runs another deltaserve
#          binary, e.g. one built from another commit and carried with `scripts/gpu-bins.sh pack-extra base BIN`:
#          DS_BIN=/tmp/ds-build-gpu/extra/base)
#   env:   AB_QUANT (default "fp8 none"), AB_ROUNDS (default 3), AB_ARGS (bench-engine args; default C = 1,
#          input 1024, output 128), AB_TIMEOUT (s per run, default 200)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD_DIR:-/tmp/ds-build-gpu}
mkdir -p "$OUT"
runs="$OUT/ab_runs.tsv"
: > "$runs"
all="$OUT/ab_all.txt"
: > "$all"
for round in $(seq 1 "${AB_ROUNDS:-3}"); do
  for q in ${AB_QUANT:-fp8 none}; do
    for spec in "$@"; do
      name=${spec%%:*}
      rest=${spec#*:}
      envs=${rest%%:*}
      extra=""
      [[ "$rest" == *:* ]] && extra=${rest#*:}
      bin="$BUILD/src/deltaserve"
      knobs=()
      for kv in ${envs//,/ }; do
        if [[ "$kv" == DS_BIN=* ]]; then bin=${kv#DS_BIN=}; else knobs+=("$kv"); fi
      done
      log="$OUT/ab_run.log"
      # The variant's knobs only for this process.
      env "${knobs[@]}" timeout "${AB_TIMEOUT:-200}" "$bin" bench-engine --random-weights \
        --preset kimi-linear-48b-a3b --quantize "$q" ${AB_ARGS:---concurrency 1 --input-len 1024 --output-len 128} \
        $extra > "$log" 2>&1
      rc=$?
      # One row per concurrency of the run ("concurrency  16: ... 95.9 tps/user ..."); a run without any: one row
      # with concurrency "*" (it failed at every concurrency).
      rows=$(sed -nE 's/^concurrency +([0-9]+):.* ([0-9.]+) tps\/user.*/\1\t\2/p' "$log")
      [ -n "$rows" ] || rows=$(printf '*\tnan')
      while IFS=$'\t' read -r conc tps; do
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$q" "$round" "$conc" "$tps" "$rc" >> "$runs"
      done <<< "$rows"
      { echo "==== $name $q round $round (rc $rc)"; cat "$log"; } >> "$all"
    done
  done
done
rm -f "$OUT/ab_run.log"
python3 - "$runs" <<'EOF' | tee "$OUT/ab.md"
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
order, quants, concs, rounds, got, ran = [], [], [], [], {}, set()
for name, q, rnd, conc, tps, rc in rows:
    if name not in order: order.append(name)
    if q not in quants: quants.append(q)
    if conc != "*" and conc not in concs: concs.append(conc)
    if rnd not in rounds: rounds.append(rnd)
    ran.add((name, q, rnd))
    got[(name, q, rnd, conc)] = float(tps) if rc == "0" else float("nan")
print("| variant | quant | concurrency | tps/user per round | median | vs " + order[0] + " |")
print("|---|---|---:|---|---:|---:|")
for q in quants:
    for c in concs or ["*"]:
        base = None
        for name in order:
            # Each round's value at this concurrency; FAILED where the run failed or did not report it.
            v = [got.get((name, q, r, c), float("nan")) for r in rounds if (name, q, r) in ran]
            ok = [x for x in v if x == x]
            med = statistics.median(ok) if ok else float("nan")
            if base is None: base = med
            rel = f"{100.0 * (med / base - 1.0):+.1f} %" if ok and base == base and base > 0 else "-"
            runs = " / ".join("FAILED" if x != x else f"{x:.1f}" for x in v)
            print(f"| {name} | {q} | {c} | {runs} | {med:.1f} | {rel} |")
EOF
