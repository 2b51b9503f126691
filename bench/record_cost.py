#!/usr/bin/env python3
"""Counts the instructions deft spends per tiny statement (recording, task,
scheduling), with callgrind: stable where wall-clock times on a shared
machine are not. Each kind of statement (bench/record_cost/statements.cpp)
runs N times and 0 times; the difference divided by N is the cost of one.

  bench/record_cost.py                    # this checkout
  bench/record_cost.py --before c94c988   # and that commit, side by side

valgrind has no AVX-512, so the program is compiled for x86-64-v3 (AVX2).
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "bench", "record_cost", "statements.cpp")
KINDS = ["record `y = x + 1` only", "record and run `y = x + 1` in place", "a new tensor per statement, run",
         "`a*b + c*2 - max(d, 0)` on 4096, run"]


def build(include, exe, cxx):
    cmd = [cxx, "-std=c++20", "-O3", "-march=x86-64-v3", "-DNDEBUG", "-I" + include, SOURCE, "-o", exe, "-pthread"]
    subprocess.run(cmd, check=True)


def instructions(exe, kind, n):
    with tempfile.NamedTemporaryFile() as out:
        r = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}", exe, str(kind), str(n)],
                           capture_output=True, text=True)
    for line in r.stderr.splitlines():
        if "Collected :" in line:
            return int(line.split(":")[-1])
    sys.exit(f"record_cost: callgrind failed on {exe}:\n{r.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", metavar="REF", help="also count the statements of this commit")
    ap.add_argument("-n", type=int, default=20000, help="statements per run (default 20000)")
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="deft-record-cost-")
    trees = [("this checkout", os.path.join(ROOT, "include"))]
    if args.before:
        dest = os.path.join(work, "before")
        os.makedirs(dest)
        archive = subprocess.run(["git", "-C", ROOT, "archive", args.before, "include"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
        trees.insert(0, (args.before, os.path.join(dest, "include")))
    counts = []
    for i, (_, include) in enumerate(trees):
        exe = os.path.join(work, f"statements{i}")
        build(include, exe, args.cxx)
        counts.append([(instructions(exe, k, args.n) - instructions(exe, k, 0)) / args.n for k in range(len(KINDS))])
    print("| instructions per statement | " + " | ".join(name for name, _ in trees) + (" | change |" if len(trees) > 1 else " |"))
    print("|---" * (len(trees) + 1 + (len(trees) > 1)) + "|")
    for k, kind in enumerate(KINDS):
        row = [f"{c[k]:.0f}" for c in counts]
        if len(trees) > 1:
            row.append(f"{100 * (counts[1][k] / counts[0][k] - 1):+.1f}%")
        print(f"| {kind} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
