#!/usr/bin/env python3
"""Where a build's time goes: builds deft's tests the README's way (Release,
no examples, `cmake --build -j2`) from a fresh copy of a commit, with every
compiler call wrapped by a launcher that logs its start and end. Prints the
build's wall and CPU time, how long one job or none ran (a core left idle),
and the longest translation units.

  bench/build_units.py                          # HEAD, everything the README's command builds
  bench/build_units.py --ref 6b758f5 --top 20
  bench/build_units.py --target deft_tests      # only what that target needs

Each unit's time is its wall time while other units compiled beside it, so
the sum exceeds the CPU time of the build when jobs slow each other down.
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from compile_time import checkout  # noqa: E402  (the commit's tree, unpacked)

LAUNCHER = """#!/bin/sh
start=$(date +%s.%N)
"$@"; rc=$?
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
echo "$start $(date +%s.%N) $out" >> "{log}"
exit $rc
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="HEAD", help="the commit to build (default: HEAD)")
    ap.add_argument("--target", action="append", default=[], help="build only this target (repeatable)")
    ap.add_argument("-j", type=int, default=2, help="parallel jobs (default: 2, as the README)")
    ap.add_argument("--top", type=int, default=12, help="how many of the longest units to list")
    ap.add_argument("--keep", action="store_true", help="keep the temporary tree and its log")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="deft_build_units_")
    src, build, log = checkout(args.ref, work), os.path.join(work, "build"), os.path.join(work, "units.log")
    launcher = os.path.join(work, "launcher.sh")
    with open(launcher, "w") as f:
        f.write(LAUNCHER.replace("{log}", log))
    os.chmod(launcher, 0o755)

    subprocess.run(["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DDEFT_BUILD_EXAMPLES=OFF",
                    "-DCMAKE_CXX_COMPILER_LAUNCHER=" + launcher, "-DCMAKE_CUDA_COMPILER_LAUNCHER=" + launcher],
                   check=True, stdout=subprocess.DEVNULL)
    cmd = ["cmake", "--build", build, "-j", str(args.j)]
    for t in args.target:
        cmd += ["--target", t]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"build_units: the build failed:\n{r.stderr[-4000:]}")

    units = []
    if os.path.exists(log):
        for line in open(log):
            parts = line.split()
            if len(parts) >= 2:
                units.append((float(parts[0]) - t0, float(parts[1]) - t0, parts[2] if len(parts) > 2 else "?"))
    # Seconds of the build during which 0, 1 or at least 2 units compiled.
    points = sorted({0.0, wall, *(x for s, e, _ in units for x in (max(s, 0.0), min(e, wall)))})
    running = [0.0, 0.0, 0.0]
    for a, b in zip(points, points[1:]):
        mid = (a + b) / 2
        running[min(2, sum(1 for s, e, _ in units if s <= mid < e))] += b - a
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    print(f"build_units: {args.ref} ({subprocess.run(['git', '-C', ROOT, 'rev-parse', '--short', args.ref], capture_output=True, text=True).stdout.strip()}), "
          f"-j{args.j}{', targets ' + ' '.join(args.target) if args.target else ''}")
    print("\n| build | seconds |\n|---|---|")
    print(f"| wall time | {wall:.0f} |")
    print(f"| CPU time (user + system, every process) | {cpu:.0f} |")
    print(f"| units timed | {len(units)} ({sum(e - s for s, e, _ in units):.0f} s summed) |")
    print(f"| no unit compiling / one / two or more | {running[0]:.0f} / {running[1]:.0f} / {running[2]:.0f} |")
    print("\n| unit | seconds | started at |\n|---|---|---|")
    for s, e, out in sorted(units, key=lambda u: u[0] - u[1])[:args.top]:
        name = os.path.relpath(out, build) if os.path.isabs(out) else out
        print(f"| {name} | {e - s:.1f} | {s:.0f} |")
    if args.keep:
        print(f"\nbuild_units: kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
