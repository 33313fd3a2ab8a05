#!/usr/bin/env python3
"""scripts/ncu_regions.py on a synthetic ncu source-page CSV with known counts (CTest: NcuRegions.*)."""
import contextlib
import csv
import gzip
import importlib.util
import io
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("ncu_regions", os.path.join(HERE, "..", "..", "scripts", "ncu_regions.py"))
nr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nr)

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed", "stall_barrier", "stall_wait", "stall_barrier (Not Issued)"]
# (source, samples, executed, barrier, wait): a prologue, then two clock-marked regions; the second holds a barrier.
LINES = [("LDC R1, c[0x0][0x28]", 4, 100, 0, 4),
         ("@!P1 CS2R R2, SR_CLOCKLO", 1, 100, 0, 1),
         ("FFMA R3, R4, R5, R6", 10, 800, 0, 10),
         ("@P0 FMUL R3, R3, R3", 5, 800, 0, 5),
         ("CS2R R7, SR_CLOCKLO", 0, 100, 0, 0),
         ("BAR.SYNC.DEFER_BLOCKING 0x0", 30, 200, 30, 0),
         ("LDS R8, [R9]", 10, 400, 0, 2)]


def write(path, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k(int)"])
        w.writerow(HEADER)
        for i, (src, s, e, b, wt) in enumerate(LINES):
            w.writerow([hex(i * 16), src, s, s, e, b, wt, b])


class NcuRegions(unittest.TestCase):
    def run_on(self, name, *args, gz=False):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, name)
            write(path, gz)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = nr.main([path, *args])
            return rc, out.getvalue()

    def test_clock_regions(self):
        rc, text = self.run_on("k.csv.gz", gz=True)
        self.assertEqual(rc, 0)
        rows = [l.split() for l in text.splitlines()[1:]]
        # region 0: the prologue (4 samples of 60); 1: from the first clock read (16); 2: from the second (40)
        self.assertEqual([r[0] for r in rows], ["0", "1", "2"])
        self.assertEqual([int(r[1]) for r in rows], [4, 16, 40])
        self.assertEqual([int(r[3]) for r in rows], [100, 1700, 700])
        self.assertIn("FFMA 800", text.splitlines()[2])
        self.assertIn("FMUL 800", text.splitlines()[2])  # the predicate is not the opcode
        self.assertIn("barrier 30", text.splitlines()[3])
        self.assertNotIn("Not Issued", text)

    def test_barrier_regions(self):
        rc, text = self.run_on("k.csv", "--split", "bar")
        self.assertEqual(rc, 0)
        rows = [l.split() for l in text.splitlines()[1:]]
        self.assertEqual([int(r[1]) for r in rows], [20, 40])

    def test_rejects_other_tables(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "x.csv")
            with open(path, "w") as f:
                f.write("a,b\n1,2\n")
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                self.assertEqual(nr.main([path]), 2)
            self.assertIn("no 'Address,Source", err.getvalue())


if __name__ == "__main__":
    unittest.main()
