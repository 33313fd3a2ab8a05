#!/usr/bin/env python3
"""scripts/gpu-ab.sh against a stand-in deltaserve: variants alternate round by round, knobs reach only their own
run, DS_BIN picks another binary, a failed run shows as FAILED and stays out of the median, and the table's
medians and changes against the first variant are right at every concurrency the runs report.

usage: gpu_ab_test.py --script scripts/gpu-ab.sh
"""
import argparse
import os
import stat
import subprocess
import sys
import tempfile

# Prints bench-engine's result lines for concurrency 1 and 16; tps/user = 100 + $KNOB_A (+ 50 for the second
# binary) at 1 and 20 + $KNOB_A at 16, and a run whose round counter hits $FAIL_ON exits 1 without a result. The
# call order goes to calls.txt.
FAKE = r"""#!/usr/bin/env bash
dir=$(dirname "$0")
n=$(( $(cat "$dir/../count" 2>/dev/null || echo 0) + 1 )); echo $n > "$dir/../count"
echo "KNOB_A=${KNOB_A:-} quant=$6 $*" >> "$dir/../calls.txt"
[ "${FAIL_ON:-0}" = "$n" ] && { echo "error: out of memory"; exit 1; }
tps=$(( 100 + ${KNOB_A:-0} + ${BONUS} ))
echo "concurrency   1: TTFT 47.8 ms, TPOT 2.372 ms, $tps.5 tps/user, step 2.306 ms (43 % of the 0.993 ms bound)"
echo "concurrency  16: TTFT 147.8 ms, TPOT 11.8 ms, $(( 20 + ${KNOB_A:-0} )).0 tps/user, step 11.3 ms"
"""


def write_fake(path, bonus):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(FAKE.replace("${BONUS}", str(bonus)))
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    a = ap.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        build = os.path.join(tmp, "build")
        write_fake(os.path.join(build, "src", "deltaserve"), 0)
        other = os.path.join(tmp, "other", "src", "deltaserve")
        write_fake(other, 50)
        out = os.path.join(tmp, "out")
        env = dict(os.environ, OUT=out, BUILD_DIR=build, AB_ROUNDS="3", AB_QUANT="fp8 none", FAIL_ON="8")
        # The build's binary counts its own calls (base, a5 per quant and round): call 8 is round 2's none run of
        # a5, which fails.
        r = subprocess.run(["bash", a.script, "base:", "a5:KNOB_A=5", f"bin:DS_BIN={other}"], env=env,
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            failures.append(f"exit {r.returncode}: {r.stderr[-2000:]}")
        table = r.stdout
        print(table)
        calls = open(os.path.join(build, "calls.txt")).read().splitlines() if os.path.exists(
            os.path.join(build, "calls.txt")) else []
        other_calls = open(os.path.join(tmp, "other", "calls.txt")).read().splitlines() if os.path.exists(
            os.path.join(tmp, "other", "calls.txt")) else []
        if len(calls) != 12 or len(other_calls) != 6:
            failures.append(f"expected 12 runs of the build's binary and 6 of DS_BIN, got {len(calls)} and "
                            f"{len(other_calls)}")
        if calls[:2] and not (calls[0].startswith("KNOB_A= quant=fp8") and calls[1].startswith("KNOB_A=5 quant=fp8")):
            failures.append(f"the variants do not alternate in spec order, or a knob leaked: {calls[:2]}")
        if any("DS_BIN" in c for c in calls + other_calls):
            failures.append("DS_BIN reached the binary's arguments")
        expect = {
            "| base | fp8 | 1 | 100.5 / 100.5 / 100.5 | 100.5 | +0.0 % |",
            "| a5 | fp8 | 1 | 105.5 / 105.5 / 105.5 | 105.5 | +5.0 % |",
            "| a5 | none | 1 | 105.5 / FAILED / 105.5 | 105.5 | +5.0 % |",
            "| bin | fp8 | 1 | 150.5 / 150.5 / 150.5 | 150.5 | +49.8 % |",
            "| base | none | 1 | 100.5 / 100.5 / 100.5 | 100.5 | +0.0 % |",
            "| base | fp8 | 16 | 20.0 / 20.0 / 20.0 | 20.0 | +0.0 % |",
            "| a5 | fp8 | 16 | 25.0 / 25.0 / 25.0 | 25.0 | +25.0 % |",
            "| a5 | none | 16 | 25.0 / FAILED / 25.0 | 25.0 | +25.0 % |",
        }
        for row in expect:
            if row not in table.splitlines():
                failures.append(f"missing table row: {row}")
        if not os.path.exists(os.path.join(out, "ab.md")) or not os.path.exists(os.path.join(out, "ab_all.txt")):
            failures.append("ab.md / ab_all.txt not written")
        elif "out of memory" not in open(os.path.join(out, "ab_all.txt")).read():
            failures.append("the failed run's log is not in ab_all.txt")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
