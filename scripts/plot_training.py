#!/usr/bin/env python3
"""Plots the CSV written by `train_fashion_mnist --csv FILE` to a PNG:
loss, train and test accuracy per epoch. Needs matplotlib
(`pip install matplotlib`, or scripts/setup_bench.sh)."""
import argparse
import csv
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("csv", help="the CSV train_fashion_mnist wrote")
    ap.add_argument("--out", default="training.png", help="the PNG to write (default training.png)")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_training.py: matplotlib is missing; pip install matplotlib")
    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"plot_training.py: {args.csv} has no rows")
    epoch = [int(r["epoch"]) for r in rows]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(epoch, [float(r["loss"]) for r in rows], marker="o")
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="loss")
    ax_acc.plot(epoch, [float(r["train_acc"]) for r in rows], marker="o", label="train")
    ax_acc.plot(epoch, [float(r["test_acc"]) for r in rows], marker="o", label="test")
    ax_acc.set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    ax_acc.legend()
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
