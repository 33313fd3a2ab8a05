#!/usr/bin/env python3
"""Audit of the non-coherent loads (ld.global.nc) of the PDL kernels.

A kernel launched with programmatic dependent launch may read its predecessor's output only on the coherent path
(pdl::load_prior, kernels/common/pdl.cuh). nvcc also emits ld.global.nc for plain reads through
`const T* __restrict__`, so the rule can be broken by a line that names no cache operator at all (the ninth
session's race on the H200). This compiles every kernel source that uses PDL to PTX with line info, maps each
ld.global.nc to the source line it came from (through inlining), and fails on any line that does not ask for the
non-coherent path by name: `__ldg(`, or inline PTX containing `ld.global.nc`. Such explicit reads are for weights
and other data no kernel writes; reviewers see them.

  usage: ptx_nc_audit.py --nvcc NVCC --src SRC_DIR [--jobs N] [FILE.cu ...]
  (no files: every .cu under SRC_DIR/kernels that uses pdl:: or moe_common.cuh)
"""
import argparse
import collections
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

EXPLICIT = ("__ldg(", "ld.global.nc")


def pdl_sources(src):
    out = []
    for root, _, files in os.walk(os.path.join(src, "kernels")):
        for f in sorted(files):
            if not f.endswith(".cu"):
                continue
            p = os.path.join(root, f)
            if uses_pdl(src, p, set()):
                out.append(p)
    return sorted(out)


def uses_pdl(src, path, seen):
    """Whether the file or a project header it includes (recursively) launches or waits under PDL."""
    if path in seen or not os.path.exists(path):
        return False
    seen.add(path)
    text = open(path, encoding="utf-8").read()
    if "pdl::" in text or "pdl_wait" in text:
        return True
    return any(uses_pdl(src, os.path.join(src, inc), seen) for inc in re.findall(r'#include "([^"]+)"', text))


def compile_ptx(nvcc, src, cu, outdir):
    ptx = os.path.join(outdir, os.path.basename(cu) + ".ptx")
    cmd = [nvcc, "-ptx", "-lineinfo", "-O3", "-DNDEBUG", "-arch=compute_90a", "-std=c++20",
           "--expt-relaxed-constexpr", "-DDELTASERVE_WITH_CUDA=1", "-DFMT_HEADER_ONLY=1", "-DFMT_CONSTEVAL=",
           "-I", src, "-x", "cu", cu, "-o", ptx]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed on {cu}:\n{r.stderr[-3000:]}")
    return ptx


def nc_lines(ptx_text):
    """(source file, line) -> count of ld.global.nc, the inlined CUDA header helpers mapped to their call site."""
    files = {m.group(1): m.group(2) for m in re.finditer(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', ptx_text, re.M)}
    counts = collections.Counter()
    cur = None
    for line in ptx_text.split("\n"):
        m = re.match(r"\s*\.loc\s+(\d+)\s+(\d+)\s+\d+(.*)", line)
        if m:
            f, ln = files.get(m.group(1), "?"), int(m.group(2))
            ia = re.search(r"inlined_at\s+(\d+)\s+(\d+)", m.group(3))
            if ("/cuda" in f or "/include/" in f) and ia:  # a toolkit intrinsic (e.g. __ldg): its caller's line
                f, ln = files.get(ia.group(1), "?"), int(ia.group(2))
            cur = (f, ln)
            continue
        if "ld.global.nc" in line:
            counts[cur] += 1
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvcc", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    src = os.path.abspath(a.src)
    cus = [os.path.abspath(f) for f in a.files] or pdl_sources(src)
    if not cus:
        print("ptx_nc_audit: no PDL kernel sources found", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        ptxs = list(pool.map(lambda cu: compile_ptx(a.nvcc, src, cu, tmp), cus))
        counts = collections.Counter()
        for p in ptxs:
            counts.update(nc_lines(open(p, encoding="utf-8").read()))
    bad, explicit = [], 0
    for (f, ln), n in sorted(counts.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        try:
            lines = open(f, encoding="utf-8").read().split("\n")
            text = lines[ln - 1]
            if text.strip().startswith(":"):  # the operands of a multi-line inline asm: its template is above
                text = " ".join(lines[max(0, ln - 3):ln])
        except (OSError, IndexError):
            text = ""
        rel = os.path.relpath(f, src) if f.startswith(src) else f
        if any(e in text for e in EXPLICIT):
            explicit += n
        else:
            bad.append(f"{rel}:{ln}: {n} ld.global.nc from: {text.strip()}")
    print(f"ptx_nc_audit: {len(cus)} sources, {sum(counts.values())} ld.global.nc, {explicit} asked for by name, "
          f"{len(bad)} source lines not")
    for b in bad:
        print("  " + b)
    if bad:
        print("A PDL kernel reads through the non-coherent path without saying so: use pdl::load_prior for a "
              "predecessor's output, __ldg for weights (kernels/common/pdl.cuh).")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
