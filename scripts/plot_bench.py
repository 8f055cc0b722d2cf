#!/usr/bin/python3
"""Draws the benchmarks' ratios against their baselines (docs/performance.png), or the scaling
benchmark's throughput against the number of workers (docs/scaling.png).

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

    ./build/scaling/bench/tasklet_bench_scaling --csv=scaling.csv
    scripts/plot_bench.py --scaling scaling.csv [-o docs/scaling.png]

With --scaling it reads the CSV of tasklet_bench_scaling (columns workload, form, body_ns, workers,
jobs_per_s, speedup, occupancy, ceiling; see bench/scaling_bench.cpp) and draws one panel per job
body: the speedup over one worker against the number of workers, a line per workload and form, the
ideal (speedup = workers) dotted; where the rule table's lock was timed, the legend gives each
line's ceiling at the most workers measured.

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
DEFAULT_SCALING_OUTPUT = os.path.join(REPO, "docs", "scaling.png")


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


def read_scaling(paths):
    """body_ns -> "workload, form" -> list of (workers, speedup, ceiling) sorted by workers."""
    panels = {}
    for path in paths:
        with open(path, newline="") as file:
            reader = csv.DictReader(file)
            missing = {"workload", "form", "body_ns", "workers", "speedup", "ceiling"} - set(reader.fieldnames or [])
            if missing:
                sys.exit(f"{path}: not a scaling CSV (no column {', '.join(sorted(missing))})")
            for record in reader:
                speedup = number(record["speedup"])
                if speedup is None:
                    continue
                label = f"{record['workload']}, {record['form']}"
                panels.setdefault(int(record["body_ns"]), OrderedDict()).setdefault(label, []).append(
                    (int(record["workers"]), speedup, number(record["ceiling"])))
    for series in panels.values():
        for points in series.values():
            points.sort()
    return dict(sorted(panels.items()))


def draw_scaling(paths, output):
    panels = read_scaling(paths)
    if not panels:
        sys.exit("no point with a speedup in " + ", ".join(paths))
    figure, grid = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5), squeeze=False)
    for axes, (body_ns, series) in zip(grid.flat, panels.items()):
        most = max(workers for points in series.values() for workers, _, _ in points)
        for label, points in series.items():
            ceiling = points[-1][2]
            if ceiling is not None:
                label += f" (ceiling {ceiling:.0f})"
            axes.plot([w for w, _, _ in points], [s for _, s, _ in points], marker="o", label=label,
                      linestyle="solid" if ", tasklets" in label else "dashed")
        axes.plot([1, most], [1, most], color="grey", linestyle="dotted", linewidth=1, label="ideal")
        axes.set_xscale("log", base=2)
        axes.set_yscale("log", base=2)
        plain = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}")
        axes.set_xticks([w for w in (1, 2, 4, 8, 16, 32, 64, 128) if w <= most] + ([most] if most & (most - 1) else []))
        axes.xaxis.set_major_formatter(plain)
        axes.yaxis.set_major_formatter(plain)
        axes.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axes.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axes.set_title(f"job body {body_ns / 1000:g} µs")
        axes.set_xlabel("workers")
        axes.set_ylabel("jobs per second over 1 worker")
        axes.grid(True, which="major", alpha=0.3)
        axes.legend(fontsize="x-small")
    figure.suptitle("tasklet scaling: speedup over one worker (higher is better)")
    figure.tight_layout(rect=(0, 0, 1, 0.95))
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    figure.savefig(output, dpi=110)
    print(f"wrote {output}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", help="CSV files written by the benchmarks' --csv")
    parser.add_argument("--scaling", action="store_true",
                        help="the files are tasklet_bench_scaling's: draw speedup against workers")
    parser.add_argument("-o", "--output", default=None,
                        help="the image to write (default: docs/performance.png, with --scaling docs/scaling.png)")
    args = parser.parse_args()
    if args.scaling:
        draw_scaling(args.csv, args.output or DEFAULT_SCALING_OUTPUT)
        return
    args.output = args.output or DEFAULT_OUTPUT

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
