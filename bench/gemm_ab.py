#!/usr/bin/env python3
"""Times the CPU GEMM of two checkouts in one process, in alternation on the
same operands: the median (and quartiles) over pairs of new time / old time
for each product, and whether both give the same bits. Each checkout's
kernel is compiled into a shared object of its own with hidden symbols
(bench/gemm_ab/entry.cpp), so the two live side by side; pairs in one
process see the same machine, which timings of two programs on this shared
VM do not.

  bench/gemm_ab.py --before d8bb4ef~1          # that commit against this checkout
  bench/gemm_ab.py --before REF --after REF2   # two commits
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "bench", "gemm_ab")
# (m, n, k, A transposed, B transposed, threads, pairs): the large square
# products, the MLP's layer and its two gradients, a 784->10 layer's.
SHAPES = [(2000, 2000, 2000, 0, 0, 1, 9), (1024, 512, 2048, 0, 0, 1, 21), (1024, 512, 2048, 0, 0, 2, 21),
          (1024, 512, 2048, 0, 1, 2, 21), (512, 2048, 1024, 1, 0, 2, 21), (4096, 4096, 4096, 0, 0, 2, 3),
          (256, 10, 784, 0, 1, 2, 41), (784, 10, 256, 1, 0, 2, 41)]


def tree(ref, work, name):
    if ref is None:
        return os.path.join(ROOT, "include")
    dest = os.path.join(work, name)
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref, "include"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return os.path.join(dest, "include")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, metavar="REF", help="the old kernel's commit")
    ap.add_argument("--after", metavar="REF", help="the new kernel's commit (default: this checkout)")
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="deft-gemm-ab-")
    flags = ["-std=c++20", "-O3", "-march=native", "-DNDEBUG", "-fPIC", "-shared", "-fvisibility=hidden",
             "-fvisibility-inlines-hidden", "-pthread"]
    libs = []
    for name, ref in (("old", args.before), ("new", args.after)):
        lib = os.path.join(work, f"{name}.so")
        subprocess.run([args.cxx, *flags, "-I" + tree(ref, work, name), os.path.join(HERE, "entry.cpp"), "-o", lib],
                       check=True)
        libs.append(lib)
    exe = os.path.join(work, "gemm_ab")
    subprocess.run([args.cxx, "-std=c++20", "-O2", os.path.join(HERE, "main.cpp"), "-o", exe, "-ldl"], check=True)
    print(f"| product (m×n×k) | threads | new time / old, median (quartiles) | same bits |")
    print("|---|---|---|---|")
    for shape in SHAPES:
        out = subprocess.run([exe, *libs, *map(str, shape)], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"gemm_ab failed on {shape}:\n{out.stderr}")
        print(out.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
