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

# OPCHECK=1: `deltaserve op` on random inputs, CPU reference vs CUDA, for both ops (numpy writes the files).
if [ "${OPCHECK:-0}" = 1 ] && ninja -C "$B" deltaserve >/tmp/kda-op-build.log 2>&1; then
  python3 - "$B/src/deltaserve" <<'PY'
import json, struct, subprocess, sys, numpy as np
rng = np.random.default_rng(0)
def bf16(a):
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7fff + ((u >> 16) & 1)) >> 16) & 0xffff).astype(np.uint16)
def write(path, t):
    hdr, off, blobs = {}, 0, []
    for n, (dt, a) in t.items():
        b = a.tobytes(); hdr[n] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b); blobs.append(b)
    h = json.dumps(hdr).encode(); h += b" " * ((8 - len(h) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
def read(path):
    d = open(path, "rb").read(); n = struct.unpack("<Q", d[:8])[0]; hdr = json.loads(d[8:8 + n]); r = {}
    for k, v in hdr.items():
        if k == "__metadata__": continue
        raw = d[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]]
        r[k] = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32) if v["dtype"] == "BF16" \
            else np.frombuffer(raw, np.float32)
    return r
H, S = 4, 5; P = H * 128
for op, R, slots, cu in [("kda-decode", 3, [3, -1, 0], None), ("kda-prefill", 150, [1, 4], [0, 100, 150])]:
    t = {n: ("BF16", bf16(rng.standard_normal((R, P)))) for n in ["q", "k", "v", "f", "gz"]}
    t["beta_logits"] = ("BF16", bf16(rng.standard_normal((R, H))))
    t["slot_ids"] = ("I32", np.array(slots, np.int32))
    if cu: t["cu_seqlens"] = ("I32", np.array(cu, np.int32))
    t["state"] = ("F32", (rng.standard_normal((S, H, 128, 128)) * 0.5).astype(np.float32))
    t["conv_state"] = ("BF16", bf16(rng.standard_normal((S, 3, 3 * P))))
    t["conv_w"] = ("BF16", bf16(rng.standard_normal((3 * P, 4)) * 0.5))
    t["A_log"] = ("F32", rng.uniform(0, 1.5, H).astype(np.float32))
    t["dt_bias"] = ("F32", (rng.standard_normal(P) - 2).astype(np.float32))
    t["o_norm_w"] = ("F32", np.ones(128, np.float32))
    write("/tmp/op_in.safetensors", t)
    outs = {}
    for dev in ["cpu", "cuda"]:
        subprocess.run([sys.argv[1], "op", op, "--in", "/tmp/op_in.safetensors", "--out", f"/tmp/op_{dev}.safetensors",
                        "--device", dev], check=True)
        outs[dev] = read(f"/tmp/op_{dev}.safetensors")
    for k in ["out", "state", "conv_state"]:
        a, b = outs["cuda"][k], outs["cpu"][k]
        print(f"[op] {op} {k}: rms_ratio={np.linalg.norm(a - b) / np.linalg.norm(b):.3e} nan={int(np.isnan(a).sum())}")
PY
fi

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
