#!/usr/bin/python3
"""Plots of one or more training runs, from their metrics.jsonl, side by side.

Usage: scripts/plot.py RUN [RUN ...] [--out DIR]

RUN is a run directory (holding metrics.jsonl) or a metrics.jsonl file. Writes into DIR (default: the
first run's directory) one PNG per figure that the runs have data for, and prints each path:

  loss.png        training loss per step, and validation loss where evaluated
  throughput.png  tokens/s and MFU per step
  memory.png      peak memory per category (MiB) per step, rank 0
  noise.png       the gradient noise scale B_simple per step (when logged)
  moe.png         mixture of experts: load imbalance and drop fraction per step (when logged)
  pipeline.png    pipeline parallelism: the measured bubble per step, and each pp rank's share (when logged)
  timeline.png    the first traced step's pipeline actions per rank (a run with trace=1 under --pp: from
                  RUN/trace/rank_*.json, the first run that has them)

Every run is one colour across the figures, labelled by its directory name. A resumed run's metrics
hold the earlier attempts too: for each step the last record counts (the one the run kept).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    """(label, {step: record}, [(step, val_loss)]) of a run; the last record of a step wins."""
    metrics = path if os.path.isfile(path) else os.path.join(path, "metrics.jsonl")
    if not os.path.isfile(metrics):
        sys.exit(f"plot.py: no metrics.jsonl in {path}")
    steps, val = {}, {}
    with open(metrics) as f:
        for n, line in enumerate(f, 1):
            if not line.endswith("\n"):
                break  # a torn last line (a run killed while writing): not a record
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot.py: {metrics}:{n}: not JSON ({e})")
            if "loss" in r and "step" in r:
                steps[r["step"]] = r
                if "val_loss" in r:
                    val[r["step"]] = r["val_loss"]
    if not steps:
        sys.exit(f"plot.py: {metrics} has no step records")
    label = os.path.basename(os.path.dirname(os.path.abspath(metrics))) or metrics
    return label, steps, sorted(val.items())


def series(steps, get):
    xs, ys = [], []
    for s in sorted(steps):
        try:
            y = get(steps[s])
        except (KeyError, TypeError):
            continue
        if y is not None:
            xs.append(s)
            ys.append(y)
    return xs, ys


def figure(runs, out, name, panels):
    """panels: [(title, ylabel, [(get, label suffix, line style)])]; writes out/name if any panel has data."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    drawn = False
    for ax, (title, ylabel, lines) in zip(axes[0], panels):
        for i, (label, steps, _) in enumerate(runs):
            for get, suffix, style in lines:
                xs, ys = series(steps, get)
                if xs:
                    ax.plot(xs, ys, style, color=f"C{i}", label=label + suffix)
                    drawn = True
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
    if drawn:
        path = os.path.join(out, name)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        print(path)
    plt.close(fig)
    return drawn


def main():
    ap = argparse.ArgumentParser(description="Plots of minitrain runs from their metrics.jsonl.")
    ap.add_argument("runs", nargs="+", help="run directories or metrics.jsonl files")
    ap.add_argument("--out", help="directory for the PNGs (default: the first run's)")
    a = ap.parse_args()
    runs = [load(p) for p in a.runs]
    out = a.out or (a.runs[0] if os.path.isdir(a.runs[0]) else os.path.dirname(os.path.abspath(a.runs[0])))
    os.makedirs(out, exist_ok=True)

    # Loss, with each run's validation points on top.
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (label, steps, val) in enumerate(runs):
        xs, ys = series(steps, lambda r: r["loss"])
        ax.plot(xs, ys, "-", color=f"C{i}", label=label + " train")
        if val:
            ax.plot([s for s, _ in val], [v for _, v in val], "o--", color=f"C{i}", label=label + " val")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "loss.png"), dpi=100)
    print(os.path.join(out, "loss.png"))
    plt.close(fig)

    figure(runs, out, "throughput.png",
           [("tokens/s", "tokens/s", [(lambda r: r["tokens_per_s"], "", "-")]),
            ("MFU", "MFU (%)", [(lambda r: 100 * r["mfu"], "", "-")])])
    categories = sorted({c for _, steps, _ in runs for r in steps.values() for c in r.get("memory", {})} - {"total"})
    mib = 1 << 20
    figure(runs, out, "memory.png",
           [(c, "MiB", [(lambda r, c=c: r["memory"][c] / mib, "", "-")]) for c in categories] or
           [("memory", "MiB", [])])
    figure(runs, out, "noise.png",
           [("gradient noise scale B_simple", "tokens", [(lambda r: r["gns"]["b_simple"], "", "-")])])
    figure(runs, out, "moe.png",
           [("load imbalance (max / mean - 1, worst layer)", "", [(lambda r: r["moe"]["imbalance"], "", "-")]),
            ("dropped token assignments", "fraction", [(lambda r: r["moe"]["drop_fraction"], "", "-")])])
    figure(runs, out, "pipeline.png",
           [("pipeline bubble (mean over pp ranks)", "share of the pipeline phase",
             [(lambda r: r["pp"]["bubble"], "", "-")]),
            ("bubble of pp rank 0 (solid) and the last (dashed)", "share",
             [(lambda r: r["pp"]["bubble_ranks"][0], " rank 0", "-"),
              (lambda r: r["pp"]["bubble_ranks"][-1], " last rank", "--")])])
    timeline(a.runs, out)


def timeline(run_paths, out):
    """The pipeline actions (F, B, B_input, W spans) of the first traced step, one row per rank."""
    for path in run_paths:
        tdir = os.path.join(path, "trace") if os.path.isdir(path) else ""
        files = sorted(f for f in os.listdir(tdir) if f.startswith("rank_") and f.endswith(".json")) if os.path.isdir(tdir) else []
        rows = []
        for f in files:
            ev = json.load(open(os.path.join(tdir, f)))["traceEvents"]
            lanes = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
            steps = sorted((e for e in ev if e["ph"] == "X" and lanes.get(e["tid"]) == "step"), key=lambda e: e["ts"])
            if not steps:
                continue
            s0 = steps[0]
            acts = [e for e in ev if e["ph"] == "X" and lanes.get(e["tid"]) == "pipeline"
                    and s0["ts"] <= e["ts"] <= s0["ts"] + s0["dur"]]
            if acts:
                rows.append((int(f[5:10]), s0, acts))
        if not rows:
            continue
        t0 = min(s0["ts"] for _, s0, _ in rows)
        fig, ax = plt.subplots(figsize=(10, 0.6 * len(rows) + 1.5))
        colour = {"F": "C0", "B": "C1", "Bi": "C2", "W": "C3"}
        for rank, _, acts in rows:
            for e in acts:
                kind = e["name"].lstrip("c0123456789").rstrip("0123456789")
                ax.broken_barh([((e["ts"] - t0) / 1e3, e["dur"] / 1e3)], (rank - 0.4, 0.8),
                               facecolors=colour.get(kind, "C7"), edgecolor="black", linewidth=0.3)
        ax.set_yticks([r for r, _, _ in rows], [f"rank {r}" for r, _, _ in rows])
        ax.invert_yaxis()
        ax.set_xlabel("ms from the first rank's start of the step (the ranks' system clocks)")
        ax.set_title(f"{os.path.basename(os.path.normpath(path))}: pipeline actions of {rows[0][1]['name']} "
                     "(F blue, B orange, B_input green, W red)")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "timeline.png"), dpi=100)
        print(os.path.join(out, "timeline.png"))
        plt.close(fig)
        return


if __name__ == "__main__":
    main()
