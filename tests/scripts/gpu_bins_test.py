#!/usr/bin/env python3
"""scripts/gpu-bins.sh on a stand-in build: pack refuses a build with a binary missing, packs the build's layout,
and unpack restores it (STAMP first) or, when the binaries do not start, says so, exits non-zero and leaves no
half set behind (the caller then builds).

usage: gpu_bins_test.py --script scripts/gpu-bins.sh
"""
import argparse
import os
import stat
import subprocess
import sys
import tempfile

FILES = ["src/deltaserve", "tests/core_tests", "tests/kernels_tests", "tests/runtime_tests",
         "tools/ktrace/libds_ktrace.so",
         "bench/gemm_bench", "bench/moe_bench"]


def make_build(root, exit_code):
    for f in FILES:
        p = os.path.join(root, f)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as fh:
            fh.write(f"#!/bin/sh\nexit {exit_code}\n")
        os.chmod(p, os.stat(p).st_mode | stat.S_IEXEC)


def run(script, *args, archive):
    env = dict(os.environ, GPU_BINS_ARCHIVE=archive)
    return subprocess.run(["bash", script, *args], env=env, capture_output=True, text=True, timeout=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    a = ap.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        archive = os.path.join(tmp, "a", "bins.tar.xz")
        good, bad = os.path.join(tmp, "good"), os.path.join(tmp, "bad")
        make_build(good, 0)
        make_build(bad, 1)
        os.remove(os.path.join(bad, "bench", "moe_bench"))  # a bench that is not built is not packed
        r = run(a.script, "pack", good, archive=archive)
        if r.returncode != 0 or not os.path.exists(archive):
            failures.append(f"pack of a complete build failed: {r.stdout} {r.stderr}")
        extra = os.path.join(tmp, "other-deltaserve")  # a second binary for the same call (an A/B's base)
        with open(extra, "w") as fh:
            fh.write("#!/bin/sh\necho base\n")
        r = run(a.script, "pack-extra", "base", extra, archive=archive)
        if r.returncode != 0 or not os.path.exists(os.path.join(tmp, "a", "extra-base.xz")):
            failures.append(f"pack-extra failed: {r.stdout} {r.stderr}")
        r = run(a.script, "pack-extra", "../evil", extra, archive=archive)
        if r.returncode == 0:
            failures.append("pack-extra accepted a name with a path in it")
        out = os.path.join(tmp, "unpacked")
        r = run(a.script, "unpack", out, archive=archive)
        xb = os.path.join(out, "extra", "base")
        if not os.access(xb, os.X_OK) or subprocess.run([xb], capture_output=True, text=True).stdout != "base\n":
            failures.append(f"unpack did not restore the extra binary: {r.stdout} {r.stderr}")
        if r.returncode != 0 or not r.stdout.startswith("commit "):
            failures.append(f"unpack failed or printed no stamp first: {r.stdout} {r.stderr}")
        for f in FILES:
            if not os.access(os.path.join(out, f), os.X_OK):
                failures.append(f"unpack lost {f}")
        os.remove(os.path.join(bad, "src", "deltaserve"))
        r = run(a.script, "pack", bad, archive=archive + ".bad")
        if r.returncode == 0 or "missing" not in r.stderr:
            failures.append(f"pack did not refuse a build without deltaserve: {r.stderr}")
        make_build(bad, 1)  # every binary present, none starts
        r = run(a.script, "pack", bad, archive=archive)
        if os.path.exists(os.path.join(tmp, "a", "extra-base.xz")):
            failures.append("a new pack kept the previous set's extra binary")
        out2 = os.path.join(tmp, "unpacked2")
        r = run(a.script, "unpack", out2, archive=archive)
        if r.returncode == 0 or "do not start" not in r.stderr:
            failures.append(f"unpack accepted binaries that do not start: {r.stdout} {r.stderr}")
        if os.path.exists(os.path.join(out2, "src")) or os.path.exists(os.path.join(out2, "tests")):
            failures.append("a rejected set was left behind")
        r = run(a.script, "unpack", out2, archive=os.path.join(tmp, "none.tar.xz"))
        if r.returncode == 0:
            failures.append("unpack without an archive succeeded")
    for f in failures:
        print("FAIL:", f)
    print("gpu-bins: pack / unpack / refusals checked" if not failures else "")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
