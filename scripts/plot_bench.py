#!/usr/bin/python3
"""Draws the benchmarks' ratios against their baselines: docs/performance.png.

Usage:
    ./build/release/bench/tasklet_bench_scheduler --csv=scheduler.csv
    ./build/release/bench/tasklet_bench_rules --csv=rules.csv
    scripts/plot_bench.py scheduler.csv rules.csv [-o docs/performance.png]

Reads the CSV files the benchmarks write with --csv (the format is described at the top of
bench/harness.hpp) and draws, for every workload measured against a baseline, its ratio against
N on a logarithmic axis, the spread of the paired ratios (least to greatest) as a band, and its
target as a dashed line over the sizes it applies to. Workloads are grouped into panels by the
part of their name before the colon ("mutex rule", "path rules", "jobs", ...). Growth rows
(size "LARGE/SMALL") and plain figures (bytes per queued job: no ratio) are left out; the tables
carry them. When one workload appears in several files, each file gets a line of its own.

Needs python3 and matplotlib: Debian's python3-matplotlib, for Debian's /usr/bin/python3 (the
interpreter the first line names; another python3 on PATH may not see it). Runs headless (Agg).
"""

import argparse
import csv
import math
import os
import sys
from collections import OrderedDict

try:
    import matplotlib

    matplotlib.use("Agg")  # headless: no display needed
    import matplotlib.pyplot as plt
    import matplotlib.ticker
except ImportError:
    sys.exit(f"plot_bench.py needs matplotlib, which {sys.executable} cannot import: install Debian's "
             "python3-matplotlib and run this script with /usr/bin/python3")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUTPUT = os.path.join(REPO, "docs", "performance.png")


def number(text):
    """The float in `text`, or None for an empty field."""
    text = (text or "").strip()
    return float(text) if text else None


def read_rows(path):
    """The plottable rows of one CSV file: comparison rows with an integer size and a ratio."""
    rows = []
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        missing = {"workload", "size", "ratio", "target"} - set(reader.fieldnames or [])
        if missing:
            sys.exit(f"{path}: not a benchmark CSV (no column {', '.join(sorted(missing))})")
        for record in reader:
            size = record["size"].strip()
            ratio = number(record["ratio"])
            if not size.isdigit() or ratio is None:
                continue  # a growth row or a plain figure
            rows.append(
                {
                    "workload": record["workload"],
                    "size": int(size),
                    "ratio": ratio,
                    "min": number(record.get("min_ratio")),
                    "max": number(record.get("max_ratio")),
                    "target": number(record["target"]),
                }
            )
    return rows


def panel_of(workload):
    """The panel a workload goes to: its name up to ": ", else its first word."""
    head, colon, _ = workload.partition(": ")
    return head.strip() if colon else workload.split()[0]


def series_label(workload, panel):
    """The workload's name without its panel's prefix."""
    rest = workload[len(panel):].lstrip(": ")
    return rest or workload


def collect(paths):
    """panel -> label -> list of rows sorted by size, in the order first seen."""
    per_file = [(path, read_rows(path)) for path in paths]
    files_of = {}
    for path, rows in per_file:
        for row in rows:
            files_of.setdefault(row["workload"], set()).add(path)
    panels = OrderedDict()
    for path, rows in per_file:
        stem = os.path.splitext(os.path.basename(path))[0]
        for row in rows:
            panel = panel_of(row["workload"])
            label = series_label(row["workload"], panel)
            if len(files_of[row["workload"]]) > 1:
                label += f" ({stem})"
            panels.setdefault(panel, OrderedDict()).setdefault(label, []).append(row)
    for series in panels.values():
        for rows in series.values():
            rows.sort(key=lambda row: row["size"])
    return panels


def draw_panel(axes, title, series):
    sizes = sorted({row["size"] for rows in series.values() for row in rows})
    targets = OrderedDict()  # target -> (colours of the series it bounds, sizes it applies to)
    for label, rows in series.items():
        xs = [row["size"] for row in rows]
        ys = [row["ratio"] for row in rows]
        (line,) = axes.plot(xs, ys, marker="o", label=label)
        colour = line.get_color()
        spread = [(row["size"], row["min"], row["max"]) for row in rows if row["min"] is not None]
        if len(spread) >= 2:
            axes.fill_between(
                [x for x, _, _ in spread],
                [low for _, low, _ in spread],
                [high for _, _, high in spread],
                color=colour,
                alpha=0.15,
                linewidth=0,
            )
        elif spread:
            x, low, high = spread[0]
            axes.vlines(x, low, high, color=colour, alpha=0.4)
        for row in rows:
            if row["target"] is not None:
                colours, at = targets.setdefault(row["target"], (set(), set()))
                colours.add(colour)
                at.add(row["size"])
    # Each target as a dashed line over the sizes it applies to (widened a little, so that a target
    # for one size still shows as a line), in its series' colour, or dark grey when it bounds several.
    for target, (colours, at) in targets.items():
        colour = next(iter(colours)) if len(colours) == 1 else "dimgrey"
        left, right = min(at) / 1.5, max(at) * 1.5
        axes.hlines(target, left, right, colors=colour, linestyles="dashed", linewidth=1.2)
        axes.annotate(f"≤ {target:g}×", (right, target), fontsize="x-small", color=colour,
                      xytext=(2, 0), textcoords="offset points", va="center")
    axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="dotted")
    axes.set_xscale("log")
    if sizes:
        low, high = min(sizes), max(sizes)
        axes.set_xlim(low / 2, high * 3)
        axes.set_xticks([10**k for k in range(int(math.log10(low)), int(math.log10(high)) + 1)])
        axes.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes.set_ylim(bottom=0)
    axes.set_title(title)
    axes.set_xlabel("N")
    axes.set_ylabel("ours / baseline")
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(fontsize="small", title="solid: measured; dashed: target", title_fontsize="small")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", help="CSV files written by the benchmarks' --csv")
    parser.add_argument("-o", "--output", default=DEFAULT_OUTPUT,
                        help="the image to write (default: docs/performance.png)")
    args = parser.parse_args()

    panels = collect(args.csv)
    if not panels:
        sys.exit("no row with a ratio and a numeric size in " + ", ".join(args.csv))
    columns = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / columns)
    figure, grid = plt.subplots(rows, columns, figsize=(7 * columns, 4.5 * rows), squeeze=False)
    for axes, (title, series) in zip(grid.flat, panels.items()):
        draw_panel(axes, title, series)
    for axes in list(grid.flat)[len(panels):]:
        axes.set_visible(False)
    figure.suptitle("tasklet benchmarks: ratio against the baseline in the same run (lower is better)")
    figure.tight_layout(rect=(0, 0, 1, 0.97))
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    figure.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
