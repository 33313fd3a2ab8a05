#!/usr/bin/env python3
"""Summarise a ktrace CSV (tools/ktrace): where one CUDA-graph launch (a decode step) spends its time.

For the graph launched most often (the decode step of the traced run), per kernel node, medians over launches:
  dur      end - start of the kernel
  wait     start - end of the previous node (negative: it started early, under programmatic dependent launch)
  exposed  end - the latest end of every earlier node: what the node adds to the step's critical path
Then the same summed per kernel (name + grid), largest exposed time first.

  usage: scripts/ktrace_summary.py trace.csv [--nodes nodes.md] [--skip 3]
"""
import argparse
import collections
import csv
import statistics
import sys


def short_name(name):
    """`void ns::f<1, true>(args)` -> `f<1, true>`."""
    n = name.replace("(anonymous namespace)::", "")
    if n.startswith("void "):
        n = n[5:]
    depth, cut = 0, len(n)
    for i, c in enumerate(n):
        depth += (c == "<") - (c == ">")
        if c == "(" and depth == 0:
            cut = i
            break
    n = n[:cut]
    depth, last = 0, 0
    for i, c in enumerate(n):
        depth += (c == "<") - (c == ">")
        if depth == 0 and n.startswith("::", i):
            last = i + 2
    return n[last:]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def summarise(rows, skip):
    """Per-node medians of the graph launched most often (rows: dicts of the CSV). Returns a dict with the graph
    id, its launches, the nodes in start order (name, grid, regs, block and median start / dur / wait / exposed,
    ns), the median launch span and the median idle time between launches."""
    launches = collections.defaultdict(list)  # (graph id, correlation id of the graph launch) -> its kernels
    loose = 0
    for r in rows:
        if int(r["graph_id"]) == 0:
            loose += 1
            continue
        launches[(int(r["graph_id"]), int(r["correlation"]))].append(r)
    if not launches:
        raise ValueError("no graph kernels")
    per_graph = collections.Counter(g for g, _ in launches)
    graph = per_graph.most_common(1)[0][0]
    mine = [ks for (g, _), ks in launches.items() if g == graph]
    size = collections.Counter(len(ks) for ks in mine).most_common(1)[0][0]
    mine = [sorted(ks, key=lambda r: int(r["start_ns"])) for ks in mine if len(ks) == size]
    mine.sort(key=lambda ks: int(ks[0]["start_ns"]))
    mine = mine[skip:]
    if not mine:
        raise ValueError(f"graph {graph} has no launches left after skipping {skip}")

    info, rel = {}, collections.defaultdict(lambda: collections.defaultdict(list))
    spans, gaps = [], []
    for i, ks in enumerate(mine):
        t0 = int(ks[0]["start_ns"])
        end_max, prev_end = None, None
        for r in ks:
            s, e, node = int(r["start_ns"]), int(r["end_ns"]), int(r["graph_node"])
            info[node] = r
            d = rel[node]
            d["start"].append(s - t0)
            d["dur"].append(e - s)
            d["wait"].append(s - prev_end if prev_end is not None else 0)
            d["exposed"].append(max(0, e - end_max) if end_max is not None else e - s)
            end_max = e if end_max is None else max(end_max, e)
            prev_end = e
        spans.append(end_max - t0)
        if i + 1 < len(mine):
            gaps.append(int(mine[i + 1][0]["start_ns"]) - end_max)
    nodes = []
    for n in sorted(rel, key=lambda n: med(rel[n]["start"])):
        r = info[n]
        nodes.append({"name": short_name(r["name"]), "grid": int(r["grid"]), "block": r["block"], "regs": r["regs"],
                      **{k: med(v) for k, v in rel[n].items()}})
    return {"graph": graph, "launches": len(mine), "size": size, "all_launches": sum(per_graph.values()),
            "loose": loose, "span": med(spans), "idle": med(gaps), "nodes": nodes}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--nodes", help="write the per-node table (markdown) to this file")
    ap.add_argument("--skip", type=int, default=3, help="first launches left out (warm-up), default 3")
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        try:
            t = summarise(list(csv.DictReader(f)), a.skip)
        except ValueError as e:
            sys.exit(f"ktrace_summary: {a.csv}: {e}")
    nodes = t["nodes"]

    us = lambda ns: ns / 1000.0
    print(f"graph {t['graph']}: {t['launches']} launches of {t['size']} kernels (after --skip {a.skip}); "
          f"{t['all_launches']} graph launches in all, {t['loose']} kernels outside graphs")
    print(f"launch span (first start -> last end), median: {us(t['span']):.1f} us; "
          f"idle between launches, median: {us(t['idle']):.1f} us")
    print(f"sum of median durations {us(sum(n['dur'] for n in nodes)):.1f} us, "
          f"sum of median exposed {us(sum(n['exposed'] for n in nodes)):.1f} us")

    agg = collections.OrderedDict()
    for n in nodes:
        x = agg.setdefault((n["name"], n["grid"]), {"calls": 0, "dur": 0.0, "exposed": 0.0, "wait": 0.0,
                                                    "regs": n["regs"], "block": n["block"]})
        x["calls"] += 1
        for k in ("dur", "exposed", "wait"):
            x[k] += n[k]
    print()
    print("| kernel | grid x block | regs | calls | dur us (sum) | exposed us (sum) | wait us (sum) | exposed/call |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (name, grid), x in sorted(agg.items(), key=lambda kv: -kv[1]["exposed"]):
        print(f"| `{name}` | {grid} x {x['block']} | {x['regs']} | {x['calls']} | {us(x['dur']):.1f} | "
              f"{us(x['exposed']):.1f} | {us(x['wait']):.1f} | {us(x['exposed']) / x['calls']:.2f} |")

    if a.nodes:
        with open(a.nodes, "w") as f:
            f.write("| # | kernel | grid | start us | dur us | wait us | exposed us |\n|---:|---|---:|---:|---:|---:|---:|\n")
            for i, n in enumerate(nodes):
                f.write(f"| {i} | `{n['name']}` | {n['grid']} | {us(n['start']):.1f} | {us(n['dur']):.2f} | "
                        f"{us(n['wait']):.2f} | {us(n['exposed']):.2f} |\n")


if __name__ == "__main__":
    main()
