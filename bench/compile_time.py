#!/usr/bin/env python3
"""Times the compilation of deft programs beside the same programs written with
its peers, and optionally the README's test command from a fresh clone.

  bench/compile_time.py                      # README hello (deft, Eigen, xtensor, libtorch), trainer,
                                             # both also in the compiled mode (DEFT_SEPARATE_COMPILATION)
  bench/compile_time.py --repeats 5 --csv ct.csv
  bench/compile_time.py --before origin/main # deft's units of that commit too, in the same rounds
  bench/compile_time.py --suite              # also the README's test command on a fresh clone of HEAD
  bench/compile_time.py --breakdown --no-trainer  # also the hello's parts: headers, one tensor, ...

Each round compiles every unit once, in turn and starting one unit further
on than the round before, so that the machine's noise falls on all of them
alike; the table shows the median wall time and peak
memory of the rounds. A peer whose headers are missing is skipped with a
note (scripts/setup_bench.sh installs Eigen and xtensor; libtorch with
libtorch-dev). The deft hello is the first C++ block of README.md, so what
is timed is what a new user compiles first.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "bench", "compile_time")


def write(workdir, name, text):
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def deft_units(root, workdir, args, label=""):
    """The deft programs of the checkout at `root`: (name, source, flags)."""
    text = open(os.path.join(root, "README.md")).read()
    block = re.search(r"```cpp\n(.*?)```", text, re.S)
    if not block:
        sys.exit(f"compile_time: {root}/README.md has no ```cpp block")
    tag = label.replace(" ", "_")
    inc = ["-I" + os.path.join(root, "include")]
    out = [(f"deft{label}: README hello", write(workdir, f"readme_hello{tag}.cpp", block.group(1)), inc),
           (f"deft{label}: empty main with deft.hpp",
            write(workdir, f"include_only{tag}.cpp", "#include <deft/deft.hpp>\n\nint main() {}\n"), inc)]
    if not args.no_trainer:
        out.append((f"deft{label}: examples/train_fashion_mnist.cpp", os.path.join(root, "examples", "train_fashion_mnist.cpp"), inc))
    if os.path.exists(os.path.join(root, "include", "deft", "src.hpp")):
        # The compiled mode: each unit only declares the runtime and nn's
        # layers, which deft/src.hpp and deft/nn_src.hpp compile once (timed
        # as units of their own).
        sep = inc + ["-DDEFT_SEPARATE_COMPILATION"]
        out.append((f"deft{label}: README hello, compiled mode", out[0][1], sep))
        if not args.no_trainer:
            out.append((f"deft{label}: trainer, compiled mode", os.path.join(root, "examples", "train_fashion_mnist.cpp"), sep))
        out.append((f"deft{label}: the compiled runtime (once per build)",
                    write(workdir, f"runtime{tag}.cpp", "#include <deft/src.hpp>\n"), sep))
        if os.path.exists(os.path.join(root, "include", "deft", "nn_src.hpp")) and not args.no_trainer:
            out.append((f"deft{label}: the compiled nn (once per build)",
                        write(workdir, f"nn{tag}.cpp", "#include <deft/nn_src.hpp>\n"), sep))
    if args.all:
        out.append((f"deft{label}: bench/group_training.cpp", os.path.join(root, "bench", "group_training.cpp"),
                    inc + ["-I" + os.path.join(root, "bench")]))
    return out


# Units that split the README hello's time into its parts (--breakdown).
ONE_TENSOR = "#include <deft/deft.hpp>\n\nint main() {\n  auto a = deft::ones({1, 2});\n  a.wait_to_read();\n}\n"
HELLO_UNTRACKED = ("#include <deft/deft.hpp>\n#include <iostream>\n\nint main() {\n  auto a = deft::ones({1, 2});\n"
                   "  auto b = deft::ones({1, 2});\n  deft::Tensor<float> c = deft::detail::eval_untracked(a * b + 2);\n"
                   "  std::cout << c << '\\n';\n}\n")
HELLO_NO_PRINT = ("#include <deft/deft.hpp>\n\nint main() {\n  auto a = deft::ones({1, 2});\n  auto b = deft::ones({1, 2});\n"
                  "  deft::Tensor<float> c = a * b + 2;\n  c.wait_to_read();\n}\n")


def breakdown_units(workdir, args):
    """The parts of the README hello: the standard headers and xsimd that
    deft.hpp includes, one tensor made and synced (the runtime it pulls in),
    and the hello without its print or with its statement untracked."""
    inc = ["-I" + os.path.join(ROOT, "include")]
    probe = write(workdir, "probe.cpp", "#include <deft/deft.hpp>\n")
    h = subprocess.run([args.cxx, "-std=c++20", *inc, "-H", "-fsyntax-only", probe], capture_output=True, text=True)
    std = sorted({line.split()[-1] for line in h.stderr.splitlines()
                  if re.match(r"^\.+ \S*/c\+\+/[0-9]+/[a-z_]+$", line)})
    std_src = "".join(f"#include <{os.path.basename(p)}>\n" for p in std) + "int main() {}\n"
    one = write(workdir, "one_tensor.cpp", ONE_TENSOR)
    return [("breakdown: the standard headers deft.hpp includes", write(workdir, "std_only.cpp", std_src), []),
            ("breakdown: the same and xsimd", write(workdir, "std_xsimd.cpp", "#include <xsimd/xsimd.hpp>\n" + std_src), []),
            ("breakdown: one tensor made and synced", one, inc),
            ("breakdown: the same, compiled mode", one, inc + ["-DDEFT_SEPARATE_COMPILATION"]),
            ("breakdown: the same at -O0", one, inc + ["-O0"]),
            ("breakdown: README hello without its print", write(workdir, "hello_no_print.cpp", HELLO_NO_PRINT), inc),
            ("breakdown: README hello, its statement untracked", write(workdir, "hello_untracked.cpp", HELLO_UNTRACKED), inc)]


def checkout(ref, workdir):
    """The tree of commit `ref`, unpacked under workdir."""
    dest = os.path.join(workdir, "before")
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return dest


def units(workdir, args):
    """(name, source, extra flags, the header it needs or None)."""
    found = [(n, s, f, None) for n, s, f in deft_units(ROOT, workdir, args)]
    if args.breakdown:
        found += [(n, s, f, None) for n, s, f in breakdown_units(workdir, args)]
    if args.before:
        found += [(n, s, f, None) for n, s, f in deft_units(checkout(args.before, workdir), workdir, args, f" at {args.before}")]
    found += [
        ("Eigen Tensor: hello", os.path.join(HERE, "hello_eigen.cpp"), ["-I/usr/include/eigen3"],
         "/usr/include/eigen3/unsupported/Eigen/CXX11/Tensor"),
        ("xtensor: hello", os.path.join(HERE, "hello_xtensor.cpp"), ["-DXTENSOR_USE_XSIMD"],
         "/usr/include/xtensor/xtensor.hpp"),
        ("libtorch: hello", os.path.join(HERE, "hello_torch.cpp"),
         ["-I/usr/include/torch/csrc/api/include", "-D_GLIBCXX_USE_CXX11_ABI=1"], "/usr/include/torch/csrc/api/include/torch/torch.h"),
    ]
    out = []
    for name, src, flags, needs in found:
        if needs and not os.path.exists(needs):
            print(f"compile_time: skipping {name} ({needs} not found)", file=sys.stderr)
            continue
        out.append((name, src, flags))
    return out


def compile_once(cxx, flags, src, obj):
    cmd = ["/usr/bin/time", "-f", "%e %M", cxx, "-std=c++20", *flags, "-c", src, "-o", obj]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"compile_time: {' '.join(cmd)} failed:\n{r.stderr[-4000:]}")
    seconds, kb = r.stderr.strip().splitlines()[-1].split()
    size = subprocess.run(["size", obj], capture_output=True, text=True).stdout.splitlines()
    text = int(size[1].split()[0]) if len(size) > 1 else 0
    return float(seconds), int(kb) / 1024, text


def suite(args):
    """The README's test command on a fresh clone of HEAD, each phase timed."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"Set up and run the tests.*?```sh\n(.*?)\n\s*```", readme, re.S)
    if not m:
        sys.exit("compile_time: README.md's test command not found")
    command = m.group(1).strip()
    clone = tempfile.mkdtemp(prefix="deft-suite-")
    subprocess.run(["git", "clone", "-q", ROOT, clone], check=True)
    print(f"compile_time: {command}\n  in a fresh clone ({clone})", flush=True)
    phases = [p.strip() for p in command.split("&&")]
    times = []
    for p in phases:
        t0 = time.monotonic()
        r = subprocess.run(p, shell=True, cwd=clone, stdout=subprocess.DEVNULL if not args.verbose else None)
        times.append((p, time.monotonic() - t0))
        if r.returncode != 0:
            sys.exit(f"compile_time: `{p}` failed (exit {r.returncode})")
    total = sum(t for _, t in times)
    print("\n| phase of the README's test command | seconds |\n|---|---|")
    for p, t in times:
        print(f"| `{p[:70]}` | {t:.0f} |")
    print(f"| total | {total:.0f} ({total / 60:.1f} min) |")
    if not args.keep:
        shutil.rmtree(clone, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="rounds (median shown); default 3")
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--flags", default="-O2 -march=native", help="default: -O2 -march=native")
    ap.add_argument("--no-trainer", action="store_true", help="leave the trainer out (about a minute a round)")
    ap.add_argument("--all", action="store_true", help="also bench/group_training.cpp")
    ap.add_argument("--breakdown", action="store_true",
                    help="also the parts of the README hello: std headers, xsimd, one tensor synced, ...")
    ap.add_argument("--csv", help="write the rounds' figures to this file")
    ap.add_argument("--before", metavar="REF", help="also time deft's units as of this commit, in the same rounds")
    ap.add_argument("--suite", action="store_true", help="also time the README's test command on a fresh clone")
    ap.add_argument("--verbose", action="store_true", help="show the suite's output")
    ap.add_argument("--keep", action="store_true", help="keep the suite's clone")
    args = ap.parse_args()

    workdir = tempfile.mkdtemp(prefix="deft-ct-")
    todo = units(workdir, args)
    flags = args.flags.split()
    runs = {name: [] for name, _, _ in todo}
    for r in range(args.repeats):
        # Each round starts one unit further on: no unit always comes first
        # or after the same one.
        start = r % len(todo)
        for name, src, extra in todo[start:] + todo[:start]:
            runs[name].append(compile_once(args.cxx, flags + extra, src, os.path.join(workdir, "unit.o")))
            print(f"  round {r + 1}: {name}: {runs[name][-1][0]:.2f} s", file=sys.stderr, flush=True)
    shutil.rmtree(workdir, ignore_errors=True)

    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "include", "examples"],
                           capture_output=True, text=True).stdout.strip()
    version = subprocess.run([args.cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    print(f"\ncommit {commit}{' + uncommitted changes' if dirty else ''}, {time.strftime('%Y-%m-%d')}, "
          f"{os.cpu_count()} cores, {version}, {args.flags}, median of {args.repeats}")
    eigen = runs.get("Eigen Tensor: hello")
    eigen_median = statistics.median(t for t, _, _ in eigen) if eigen else None
    print("\n| translation unit | seconds (median) | min | peak MB | text bytes | / Eigen hello |\n|---|---|---|---|---|---|")
    for name, rounds in runs.items():
        med = statistics.median(t for t, _, _ in rounds)
        ratio = f"{med / eigen_median:.2f}" if eigen_median else "-"
        print(f"| {name} | {med:.2f} | {min(t for t, _, _ in rounds):.2f} | {max(m for _, m, _ in rounds):.0f} | "
              f"{rounds[-1][2]} | {ratio} |")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("unit,round,seconds,peak_mb,text_bytes\n")
            for name, rounds in runs.items():
                for i, (t, m, x) in enumerate(rounds):
                    f.write(f"\"{name}\",{i},{t:.3f},{m:.0f},{x}\n")
    if args.suite:
        suite(args)


if __name__ == "__main__":
    main()
