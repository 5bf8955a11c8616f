#!/usr/bin/env python3
"""Per-phase figures of a harness run's raw.csv, as a Markdown table.

For each system and phase, from the adapter's samples (one every SAMPLE_EVERY_S):
completion/s (median, lowest), enqueue/s (median), claim p99 (median, peak; the adapter's
rolling 30 s window), the backlog (queue_depth: median, peak; stagedoor's `queue_depth_peak`
is the highest 200 ms depth read between two samples), and the machine's 1-minute load average
over the phase (from run-native's uptime.txt), which says how much CPU the run had.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
from collections import defaultdict
from datetime import datetime


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def loads(path: str | None) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    if not path:
        return out
    with open(path) as fh:
        for line in fh:
            m = re.match(r"(\S+) .*load average: ([\d.]+)", line)
            if m:
                out.append((ts(m.group(1)), float(m.group(2))))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw_csv")
    p.add_argument("--uptime")
    a = p.parse_args()
    # (system, phase) -> metric -> [(t, value)]
    data: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    order: list[tuple[str, str]] = []
    with open(a.raw_csv) as fh:
        for row in csv.DictReader(fh):
            if row["subject_kind"] != "adapter":
                continue
            key = (row["system"], row["phase_label"])
            if key not in data:
                order.append(key)
            data[key][row["metric"]].append((ts(row["sampled_at"]), float(row["value"])))
    load = loads(a.uptime)

    def col(m: dict, name: str) -> list[float]:
        return [v for _, v in m.get(name, [])]

    print(
        "| system | phase | samples | completion/s median | lowest | enqueue/s median "
        "| claim p99 median (ms) | claim p99 peak (ms) | backlog median | backlog peak "
        "| load 1-min (min-max) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for key in order:
        m = data[key]
        done = col(m, "completion_rate")
        enq = col(m, "enqueue_rate")
        p99 = col(m, "claim_p99_ms")
        depth = col(m, "queue_depth")
        peak = col(m, "queue_depth_peak") or depth
        times = [t for t, _ in m.get("completion_rate", [])]
        ls = [v for t, v in load if times and min(times) - 5 <= t <= max(times)]
        f = lambda xs, fn: f"{fn(xs):.0f}" if xs else "-"  # noqa: E731
        print(
            f"| {key[0]} | {key[1]} | {len(done)} | {f(done, statistics.median)} | {f(done, min)} "
            f"| {f(enq, statistics.median)} | {f(p99, statistics.median)} | {f(p99, max)} "
            f"| {f(depth, statistics.median)} | {f(peak, max)} "
            f"| {f'{min(ls):.2f}-{max(ls):.2f}' if ls else '-'} |"
        )


if __name__ == "__main__":
    main()
