#!/usr/bin/env python3
"""scripts/ktrace_summary.py on a synthetic trace with known timings (CTest: KtraceSummary.*)."""
import contextlib
import importlib.util
import io
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("ktrace_summary", os.path.join(HERE, "..", "..", "scripts",
                                                                             "ktrace_summary.py"))
ks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ks)

HEADER = "start_ns,end_ns,graph_id,graph_node,correlation,stream,grid,block,regs,smem,name"
GEMV = 'void ds::gemm::(anonymous namespace)::gemv_kernel<1, true, false, true>(uint4 const*, int, float)'
NORM = 'void ds::norm::rmsnorm_kernel<(bool)1>(bf16 const*, long, bf16*, "quoted", int)'


def trace():
    """Graph 7 launched 5 times, 20 us apart. Nodes per launch (us from the launch's first start):
    11 norm [0, 2]; 12 gemv [1.5, 11.5] (PDL: starts 0.5 before the norm ends); 13 norm [11, 12] (ends before
    nothing later: exposed 0.5); 14 norm [11.2, 11.4] (inside 13: exposed 0). Launch 3 runs its gemv 2 us longer.
    Graph 9 launched once and three kernels outside graphs must be ignored."""
    rows = []
    t = 1_000_000
    for i in range(5):
        corr = 100 + i
        slow = 2000 if i == 3 else 0
        for node, (s, e, name, grid) in enumerate([(0, 2000, NORM, 1), (1500, 11500 + slow, GEMV, 393),
                                                   (11000 + slow, 12000 + slow, NORM, 1),
                                                   (11200 + slow, 11400 + slow, NORM, 1)], start=11):
            rows.append({"start_ns": str(t + s), "end_ns": str(t + e), "graph_id": "7", "graph_node": str(node),
                         "correlation": str(corr), "stream": "3", "grid": str(grid), "block": "256", "regs": "80",
                         "smem": "0", "name": name})
        t += 12000 + slow + 20000
    rows.append({"start_ns": "5", "end_ns": "9", "graph_id": "9", "graph_node": "1", "correlation": "50",
                 "stream": "3", "grid": "1", "block": "32", "regs": "8", "smem": "0", "name": "void x()"})
    for k in range(3):
        rows.append({"start_ns": str(k), "end_ns": str(k + 1), "graph_id": "0", "graph_node": "0",
                     "correlation": str(60 + k), "stream": "3", "grid": "1", "block": "32", "regs": "8",
                     "smem": "0", "name": "void y()"})
    return rows


class KtraceSummary(unittest.TestCase):
    def test_short_names(self):
        self.assertEqual(ks.short_name(GEMV), "gemv_kernel<1, true, false, true>")
        self.assertEqual(ks.short_name("void a::b<c::d<1>>::f<2>(int)"), "f<2>")
        self.assertEqual(ks.short_name("plain"), "plain")

    def test_medians_of_the_most_launched_graph(self):
        t = ks.summarise(trace(), skip=1)
        self.assertEqual((t["graph"], t["launches"], t["size"], t["all_launches"], t["loose"]), (7, 4, 4, 6, 3))
        self.assertEqual(t["span"], 12000)  # launches 1, 2, 4: 12 us; launch 3: 14 us
        self.assertEqual(t["idle"], 20000)
        got = [(n["name"], n["grid"], n["start"], n["dur"], n["wait"], n["exposed"]) for n in t["nodes"]]
        self.assertEqual(got, [
            ("rmsnorm_kernel<(bool)1>", 1, 0, 2000, 0, 2000),
            ("gemv_kernel<1, true, false, true>", 393, 1500, 10000, -500, 9500),
            ("rmsnorm_kernel<(bool)1>", 1, 11000, 1000, -500, 500),
            ("rmsnorm_kernel<(bool)1>", 1, 11200, 200, -800, 0),
        ])

    def test_csv_round_trip_and_tables(self):
        with tempfile.TemporaryDirectory() as d:
            path, nodes = os.path.join(d, "t.csv"), os.path.join(d, "nodes.md")
            with open(path, "w") as f:
                f.write(HEADER + "\n")
                for r in trace():
                    name = '"' + r["name"].replace('"', '""') + '"'  # as ktrace.cpp writes it
                    f.write(",".join(r[k] for k in HEADER.split(",")[:-1]) + "," + name + "\n")
            out = io.StringIO()
            argv = sys.argv
            sys.argv = ["ktrace_summary.py", path, "--nodes", nodes, "--skip", "1"]
            try:
                with contextlib.redirect_stdout(out):
                    ks.main()
            finally:
                sys.argv = argv
            text = out.getvalue()
            self.assertIn("graph 7: 4 launches of 4 kernels", text)
            self.assertIn("| `gemv_kernel<1, true, false, true>` | 393 x 256 | 80 | 1 | 10.0 | 9.5 | -0.5 | 9.50 |",
                          text)
            self.assertIn("| `rmsnorm_kernel<(bool)1>` | 1 x 256 | 80 | 3 | 3.2 | 2.5 | -1.3 | 0.83 |", text)
            with open(nodes) as f:
                self.assertEqual(len(f.read().splitlines()), 2 + 4)

    def test_no_graph_kernels_is_an_error(self):
        with self.assertRaises(ValueError):
            ks.summarise([r for r in trace() if r["graph_id"] == "0"], skip=0)


if __name__ == "__main__":
    unittest.main()
