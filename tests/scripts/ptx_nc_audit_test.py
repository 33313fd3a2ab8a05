#!/usr/bin/env python3
"""scripts/ptx_nc_audit.py on two synthetic PDL kernels: an implicit .nc read (a plain read of a const __restrict__
pointer) must fail the audit, the same read through pdl::load_prior-style __ldca or an explicit __ldg must pass."""
import argparse
import os
import subprocess
import sys
import tempfile

KERNEL = r'''
#include "kernels/pdl_stub.cuh"
__global__ void k(const float* __restrict__ x, float* __restrict__ y, int n) {
  pdl::wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * READ;
}
'''
STUB = "namespace pdl { __device__ __forceinline__ void wait() { asm volatile(\"griddepcontrol.wait;\" ::: \"memory\"); } }\n"


def audit(nvcc, script, read):
    with tempfile.TemporaryDirectory() as src:
        os.makedirs(os.path.join(src, "kernels"))
        open(os.path.join(src, "kernels", "pdl_stub.cuh"), "w").write(STUB)
        open(os.path.join(src, "kernels", "k.cu"), "w").write(KERNEL.replace("READ", read))
        r = subprocess.run([sys.executable, script, "--nvcc", nvcc, "--src", src], capture_output=True, text=True)
        print(f"{read}: rc={r.returncode}\n{r.stdout}{r.stderr}")
        return r.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvcc", required=True)
    ap.add_argument("--script", required=True)
    a = ap.parse_args()
    fails = 0
    for read, want in (("x[i]", 1), ("__ldg(x + i)", 0), ("__ldca(x + i)", 0)):
        rc = audit(a.nvcc, a.script, read)
        if rc != want:
            print(f"FAIL: {read}: exit {rc}, expected {want}")
            fails += 1
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
