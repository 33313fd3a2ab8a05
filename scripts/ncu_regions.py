#!/usr/bin/env python3
"""Where a kernel's instructions and warp stalls go, region by region of its SASS.

Reads the source page of an ncu report exported as CSV (`ncu -i R.ncu-rep --page source --csv --print-source
sass > R.csv`, optionally gzipped) and cuts the instruction stream into regions at clock reads (`CS2R ...
SR_CLOCKLO`, the phase marks of the KDA intra kernel) or, with --split bar, at block barriers (`BAR.SYNC`). Per
region: warp-stall samples (share of the kernel), warp instructions executed, the most common opcodes and the top
stall reasons. Used on the KDA prefill kernels (scripts/gpu-ncu.sh kda); docs/perf.md has what it showed.

With --lines N it prints instead the N SASS lines with the most stall samples, each with its top stall reasons
(where a loop waits, line by line).

  usage: scripts/ncu_regions.py R.csv[.gz] [--split clock|bar] [--top N] [--lines N]
"""
import argparse
import collections
import csv
import gzip
import re
import sys

OPCODE = re.compile(r"\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def read_rows(path):
    """(header, rows) of the source table: ncu prints one kernel-name line before the header."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    for i, r in enumerate(rows):
        if "Source" in r and "Address" in r:
            return r, rows[i + 1:]
    raise ValueError(f"{path}: no 'Address,Source,...' header (export with --page source --csv)")


def number(v):
    try:
        return int(float(v))
    except ValueError:
        return 0


def regions(header, rows, split):
    col = {h: i for i, h in enumerate(header)}
    for need in ("Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"):
        if need not in col:
            raise ValueError(f"the source table has no column '{need}'")
    stalls = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    marker = (lambda s: "SR_CLOCKLO" in s) if split == "clock" else (lambda s: "BAR.SYNC" in s)
    out = [collections.defaultdict(collections.Counter)]  # region 0: everything before the first mark
    for r in rows:
        if len(r) < len(header):
            continue
        src = r[col["Source"]]
        if marker(src):
            out.append(collections.defaultdict(collections.Counter))
        reg = out[-1]
        m = OPCODE.match(src)
        executed = number(r[col["Instructions Executed"]])
        reg["total"]["samples"] += number(r[col["Warp Stall Sampling (All Samples)"]])
        reg["total"]["executed"] += executed
        reg["total"]["lines"] += 1
        if m:
            reg["ops"][m.group(1)] += executed
        for h in stalls:
            reg["stalls"][h[len("stall_"):]] += number(r[col[h]])
    return out


def report(regs, top, file=None):
    file = file or sys.stdout
    samples = sum(r["total"]["samples"] for r in regs) or 1
    print(f"{'region':>6} {'samples':>9} {'share':>6} {'warp instr':>12}  top opcodes | top stalls", file=file)
    for i, r in enumerate(regs):
        t = r["total"]
        if not t["lines"]:
            continue
        ops = ", ".join(f"{o} {v}" for o, v in r["ops"].most_common(top))
        st = ", ".join(f"{s} {v}" for s, v in r["stalls"].most_common(top) if v)
        print(f"{i:>6} {t['samples']:>9} {100.0 * t['samples'] / samples:>5.1f}% {t['executed']:>12}  {ops} | {st}",
              file=file)


def hot_lines(header, rows, n, top, file=None):
    file = file or sys.stdout
    col = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    lines = [r for r in rows if len(r) >= len(header)]
    samples = sum(number(r[col["Warp Stall Sampling (All Samples)"]]) for r in lines) or 1
    lines.sort(key=lambda r: -number(r[col["Warp Stall Sampling (All Samples)"]]))
    for r in lines[:n]:
        s = number(r[col["Warp Stall Sampling (All Samples)"]])
        why = collections.Counter({h[len("stall_"):]: number(r[col[h]]) for h in stalls})
        st = ", ".join(f"{k} {v}" for k, v in why.most_common(top) if v)
        addr = r[col["Address"]] if "Address" in col else ""
        print(f"{addr:>8} {100.0 * s / samples:>5.1f}% {r[col['Source']].strip()[:70]:<70} | {st}", file=file)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--split", choices=("clock", "bar"), default="clock")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--lines", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        header, rows = read_rows(a.csv)
        if a.lines > 0:
            hot_lines(header, rows, a.lines, a.top)
        else:
            report(regions(header, rows, a.split), a.top)
    except (OSError, ValueError) as e:
        print(f"ncu_regions: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
