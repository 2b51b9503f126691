#!/usr/bin/env python3
"""Counts the instructions deft spends per tiny statement (recording, task,
scheduling), with callgrind: stable where wall-clock times on a shared
machine are not. Each kind of statement (bench/record_cost/statements.cpp)
runs N times and 0 times; the difference divided by N is the cost of one.

  bench/record_cost.py                    # this checkout
  bench/record_cost.py --before c94c988   # and that commit, side by side
  bench/record_cost.py --locked           # also the locked instructions per statement

Locked instructions (x86 `lock`-prefixed ones and `xchg` with memory: atomic
reference counts, spin locks) are counted in the program's own code from
callgrind's per-instruction counts; libraries' are not counted.

valgrind has no AVX-512, so the program is compiled for x86-64-v3 (AVX2).
"""
import argparse
import collections
import os
import re
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


def locked_addresses(exe):
    """Address -> function of each locked instruction in exe's code."""
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", exe], capture_output=True, text=True,
                         check=True).stdout
    found, func = {}, None
    for line in dis.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            func = m.group(1)
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if m and (m.group(2) == "lock" or (m.group(2) == "xchg" and "(" in m.group(3))):
            found[int(m.group(1), 16)] = func
    return found


def locked(exe, kind, n):
    """Locked instructions executed by exe's own code: total and per function."""
    marks = locked_addresses(exe)
    with tempfile.NamedTemporaryFile() as out:
        subprocess.run(["valgrind", "--tool=callgrind", "--dump-instr=yes", "--dump-line=no",
                        f"--callgrind-out-file={out.name}", exe, str(kind), str(n)], capture_output=True, check=True)
        lines = open(out.name).read().splitlines()
    objects, current, at, after_call = {}, None, 0, False
    own = os.path.realpath(exe)
    per_function = collections.Counter()
    for line in lines:
        if line.startswith(("ob=", "cob=")):  # "(id) path" names an object, "(id)" refers to it again
            key, _, rest = line.partition("=")
            m = re.match(r"\((\d+)\)\s*(.*)", rest)
            if m and m.group(2):
                objects[m.group(1)] = m.group(2)
            if key == "ob":
                current = objects.get(m.group(1)) if m else rest
            continue
        if line.startswith("calls="):
            after_call = True
            continue
        if not line or not (line[0].isdigit() or line[0] in "+-*"):
            continue
        parts = line.split()
        pos = parts[0]
        if pos.startswith("0x"):
            at = int(pos, 16)
        elif pos[0] in "+-":
            step = int(pos[1:], 16) if pos[1:].startswith("0x") else int(pos[1:])
            at += step if pos[0] == "+" else -step
        if after_call:  # the cost line of a call: its position is the call site, its cost the callee's
            after_call = False
            continue
        if current and os.path.realpath(current) == own and at in marks and len(parts) > 1:
            per_function[marks[at]] += int(parts[1])
    return sum(per_function.values()), per_function


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", metavar="REF", help="also count the statements of this commit")
    ap.add_argument("-n", type=int, default=20000, help="statements per run (default 20000)")
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--locked", action="store_true", help="also count locked instructions per statement")
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
    if not args.locked:
        return
    print("\n| locked instructions per statement | " + " | ".join(name for name, _ in trees) + " |")
    print("|---" * (len(trees) + 1) + "|")
    tops = []
    for k, kind in enumerate(KINDS):
        row = []
        for i in range(len(trees)):
            exe = os.path.join(work, f"statements{i}")
            total, per_function = locked(exe, k, args.n)
            base, _ = locked(exe, k, 0)
            row.append(f"{(total - base) / args.n:.1f}")
            tops = per_function
        print(f"| {kind} | " + " | ".join(row) + " |")
    print(f"\nwhere, in the last kind ({trees[-1][0]}; per statement, start-up included):")
    for func, count in tops.most_common(8):
        print(f"  {count / args.n:6.2f}  {func[:110]}")


if __name__ == "__main__":
    main()
