#!/usr/bin/env python3
"""Two builds' `moe_bench --tiles` sweeps side by side: the MoE stream path's full_us per format pair, token count
and tile count, the fastest tile count of each, and the change at the rule's pick.

Each argument is a glob of moe_bench --tiles logs of one build (e.g. two runs alternated with the other build's in
one device call). A sweep line holds two rounds per tile count; the table gives the median of every round of every
matching file. "rule" is each build's own moe_stream_token_tiles() pick, as its sweep lines print it, so a rule
change shows as a different pick. Used for docs/perf-moe.md run 20.

  usage: scripts/tiles_compare.py 'base/tiles*.txt' 'new/tiles*.txt'
"""
import glob
import re
import statistics
import sys

LINE = re.compile(r"#   stream token tiles \((\S+), T = (\d+), default (\d+);.*?\):(.*)")
ENTRY = re.compile(r" (\d+):([\d.]+)/([\d.]+)")


def load(pattern):
    """{(format pair, T): {"rule": tiles, tiles: [full_us, ...]}} from every file matching pattern."""
    files = sorted(glob.glob(pattern))
    if not files:
        sys.exit(f"tiles_compare: no file matches {pattern}")
    sweep = {}
    for path in files:
        with open(path) as f:
            for line in f:
                m = LINE.match(line)
                if not m:
                    continue
                row = sweep.setdefault((m.group(1), int(m.group(2))), {"rule": int(m.group(3))})
                for tiles, _op, full in ENTRY.findall(m.group(4)):
                    row.setdefault(int(tiles), []).append(float(full))
    if not sweep:
        sys.exit(f"tiles_compare: no sweep lines in {pattern} (moe_bench --tiles logs?)")
    return sweep


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    a, b = load(sys.argv[1]), load(sys.argv[2])
    tiles = (1, 2, 4, 8)
    print(f"{'pair':20} {'T':>4} | {'A full_us 1 / 2 / 4 / 8':>35} best rule | {'B full_us 1 / 2 / 4 / 8':>35} "
          f"best rule | A rule -> B rule")
    for key in sorted(set(a) & set(b)):
        ma = {t: statistics.median(a[key][t]) for t in tiles if t in a[key]}
        mb = {t: statistics.median(b[key][t]) for t in tiles if t in b[key]}
        if not ma or not mb:
            continue
        ra, rb = a[key]["rule"], b[key]["rule"]
        cells_a = " ".join(f"{ma.get(t, float('nan')):8.1f}" for t in tiles)
        cells_b = " ".join(f"{mb.get(t, float('nan')):8.1f}" for t in tiles)
        change = ""
        if ra in ma and rb in mb:
            change = f"{ma[ra]:8.1f} -> {mb[rb]:8.1f} ({100 * (mb[rb] / ma[ra] - 1):+5.1f} %)"
        print(f"{key[0]:20} {key[1]:4} | {cells_a} {min(ma, key=ma.get):4} {ra:4} | {cells_b} "
              f"{min(mb, key=mb.get):4} {rb:4} | {change}")
    only = sorted(set(a) ^ set(b))
    if only:
        print(f"in one side only: {', '.join(f'{p} T = {t}' for p, t in only)}")


if __name__ == "__main__":
    main()
