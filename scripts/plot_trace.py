#!/usr/bin/env python3
"""Draws a Chrome trace written by deft::engine::trace_to as a PNG timeline:
one row per lane (worker or caller thread), one bar per task slice, labelled
with the task's name where it fits; a worker's help with another thread's
split task is drawn hatched in that task's colour. For places without a browser; Perfetto
(ui.perfetto.dev) or chrome://tracing open the same JSON interactively.

    python3 scripts/plot_trace.py trace.json trace.png [--title TEXT]
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    try:
        with open(args.trace) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"plot_trace: cannot read {args.trace}: {e}")

    names, order, slices = {}, {}, []
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[e["tid"]] = e["args"]["name"]
        elif e["ph"] == "M" and e["name"] == "thread_sort_index":
            order[e["tid"]] = e["args"]["sort_index"]
        elif e["ph"] == "X":
            slices.append(e)
    if not any(s.get("cat") != "help" for s in slices):
        sys.exit(f"plot_trace: {args.trace} holds no task slices")
    lanes = sorted(names, key=lambda t: order.get(t, t))
    row = {tid: i for i, tid in enumerate(lanes)}
    t0 = min(s["ts"] for s in slices)
    span = max(s["ts"] + s["dur"] for s in slices) - t0
    unit, scale = ("ms", 1e-3) if span > 2000 else ("µs", 1.0)

    palette = plt.get_cmap("tab10")
    colours = {}
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.7 * len(lanes)))
    for s in slices:
        help_ = s.get("cat") == "help"
        name = s["name"][: -len(" (help)")] if help_ and s["name"].endswith(" (help)") else s["name"]
        colour = colours.setdefault(name, palette(len(colours) % 10))
        x, w = (s["ts"] - t0) * scale, s["dur"] * scale
        y = row[s["tid"]]
        ax.broken_barh([(x, w)], (y - 0.35, 0.7), facecolors=colour, edgecolors="black", linewidth=0.4,
                       hatch="///" if help_ else None, alpha=0.55 if help_ else 1.0)
        if w > span * scale * 0.06:
            ax.text(x + w / 2, y, name + (" (help)" if help_ else ""), ha="center", va="center", fontsize=8)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([names[t] for t in lanes])
    ax.invert_yaxis()
    ax.set_xlabel(f"time since the first traced task ({unit})")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), loc="upper right", fontsize=8, ncol=len(colours))
    tasks = sum(1 for s in slices if s.get("cat") != "help")
    ax.set_title(args.title or f"{tasks} tasks on {len(lanes)} lanes")
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"plot_trace: {tasks} task slices, {len(slices) - tasks} help slices on {len(lanes)} lanes -> {args.png}")


if __name__ == "__main__":
    main()
