#!/usr/bin/env python3
"""Turns deft_bench's CSV (--csv FILE) into PNG charts for docs/benchmarks.md.

usage: scripts/plot_bench.py bench.csv [--out docs/images]

One chart per group (elementwise, broadcast, reduce, gemm, record): for every
case and size a cluster of bars, one per library and thread count, showing
the median (min as a tick). Time rows are drawn as speed relative to deft
(deft = 1, higher is faster) so that cases of very different sizes share an
axis; the GEMM chart shows GFLOP/s instead.
"""
import argparse
import csv
import os
from collections import OrderedDict, defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns/op": 1e-9}
COLORS = {
    "deft": "#1f77b4", "hand": "#7f7f7f", "hand-omp": "#bcbd22", "eigen-array": "#2ca02c",
    "eigen-tensor": "#98df8a", "eigen": "#2ca02c", "xtensor": "#9467bd", "openblas": "#ff7f0e", "torch": "#d62728",
}


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["threads"] = int(r["threads"])
        r["median"] = float(r["median"])
        r["min"] = float(r["min"])
    return rows


def relative_chart(rows, group, title, out):
    """Speed relative to deft's row with the same case/size (and thread count when deft has one)."""
    rows = [r for r in rows if r["group"] == group and r["unit"] in TIME_UNITS]
    if not rows:
        return None
    deft = {}
    for r in rows:
        if r["library"] == "deft":
            deft[(r["case"], r["size"], r["threads"])] = r["median"]
            key = (r["case"], r["size"], -1)
            deft[key] = r["median"] if key not in deft else deft[key]
    clusters = OrderedDict()
    for r in rows:
        ref = deft.get((r["case"], r["size"], r["threads"])) or deft.get((r["case"], r["size"], -1))
        if not ref:
            continue
        label = f'{r["case"]}\n{r["size"]}, {r["threads"]} thr'
        clusters.setdefault(label, []).append((r["library"], r["library"], ref / r["median"]))
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * sum(len(v) for v in clusters.values()) / 3), 4.8))
    x = 0
    ticks, names = [], []
    seen = set()
    for label, bars in clusters.items():
        start = x
        for name, lib, speed in bars:
            ax.bar(x, speed, color=COLORS.get(lib, "#17becf"), label=lib if lib not in seen else None)
            seen.add(lib)
            ax.text(x, speed, f"{speed:.2f}", ha="center", va="bottom", fontsize=6, rotation=90)
            x += 1
        ticks.append((start + x - 1) / 2)
        names.append(label)
        x += 1
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("speed relative to deft (higher is faster; deft = 1)")
    ax.set_xticks(ticks)
    ax.set_xticklabels(names, fontsize=7)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=4, loc="best")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def gemm_chart(rows, out):
    rows = [r for r in rows if r["group"] == "gemm" and r["unit"] == "GFLOP/s"]
    if not rows:
        return None
    by = defaultdict(dict)
    libs = []
    for r in rows:
        key = f'{r["size"]}\n{r["threads"]} thr'
        by[key][r["library"]] = (r["median"], r["min"])
        if r["library"] not in libs:
            libs.append(r["library"])
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(libs)
    for i, lib in enumerate(libs):
        xs, ys = [], []
        for j, key in enumerate(by):
            if lib in by[key]:
                xs.append(j + i * width)
                ys.append(by[key][lib][0])
        ax.bar(xs, ys, width, label=lib, color=COLORS.get(lib, "#17becf"))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(by))])
    ax.set_xticklabels(list(by), fontsize=8)
    ax.set_ylabel("GFLOP/s (median)")
    ax.set_title("float32 matrix product C = A*B, m x k x n")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv")
    p.add_argument("--out", default="docs/images")
    a = p.parse_args()
    rows = load(a.csv)
    os.makedirs(a.out, exist_ok=True)
    made = [
        relative_chart(rows, "elementwise", "fused y = a*b + c*2 - max(d, 0), float32", os.path.join(a.out, "bench_elementwise.png")),
        relative_chart(rows, "broadcast", "broadcasting and softmax, 1024 x 2048 float32", os.path.join(a.out, "bench_broadcast.png")),
        relative_chart(rows, "reduce", "reductions, float32", os.path.join(a.out, "bench_reduce.png")),
        gemm_chart(rows, os.path.join(a.out, "bench_gemm.png")),
        relative_chart(rows, "record", "cost of one tiny op (ns/op)", os.path.join(a.out, "bench_record.png")),
        relative_chart(rows, "training", "training and inference (MLP step, batch-1 forward, Fashion-MNIST epoch)",
                       os.path.join(a.out, "bench_training.png")),
    ]
    for m in made:
        if m:
            print("wrote", m)


if __name__ == "__main__":
    main()
