"""The replay's outputs for people and for other tools: text, JSON and the segments CSV."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

from scheduler.sim.metrics import SHARING_FACTOR, SHARING_SLACK_S
from scheduler.sim.records import JobRecord

JOBS_OUT_COLUMNS = ("job_id", "tenant", "gpus", "submit_s", "start_s", "end_s", "preempted")


def write_jobs_csv(records: Iterable[JobRecord], out: TextIO) -> int:
    """One row per run segment; returns the number of rows."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(JOBS_OUT_COLUMNS)
    rows = 0
    for record in records:
        for segment in record.segments:
            writer.writerow(
                (
                    record.job_id,
                    record.tenant,
                    _exact(record.gpus),
                    _exact(record.submit_s),
                    _exact(segment.start_s),
                    _exact(segment.end_s),
                    int(segment.preempted),
                )
            )
            rows += 1
    return rows


def _exact(value: float) -> str:
    """Whole numbers without a fraction, others with every digit (so figures recompute)."""
    return str(int(value)) if value == int(value) else repr(value)


def save_jobs_csv(records: Iterable[JobRecord], path: str | Path) -> int:
    with open(path, "w", newline="", encoding="utf-8") as out:
        return write_jobs_csv(records, out)


def save_json(report: Mapping[str, Any], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as out:
        json.dump(report, out, indent=2, sort_keys=True)
        out.write("\n")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


def render_text(report: Mapping[str, Any]) -> str:
    """A short human summary of one policy's replay."""
    lines = [
        f"policy {report['policy']} on {report['gpus']} GPUs "
        f"({report['gpus_per_node']} per node), {report['jobs']} jobs finished",
        f"  wait   mean {report['mean_wait_s']:.0f} s  p50 {report['p50_wait_s']:.0f} s  "
        f"p99 {report['p99_wait_s']:.0f} s   (bound 0)",
        f"  JCT    mean {report['mean_jct_s']:.0f} s  p50 {report['p50_jct_s']:.0f} s  "
        f"p99 {report['p99_jct_s']:.0f} s   (bound: mean duration {report['mean_duration_s']:.0f} s)",
        f"  makespan {_hours(report['makespan_s'])} (bound {_hours(report['makespan_lower_bound_s'])})",
        f"  utilisation {report['utilisation']:.4f} of bound {report['utilisation_bound']:.4f} "
        f"({report['utilisation_vs_bound']:.1%}); offered load {report['offered_load']:.4f}",
        f"  jain_waiting {report['jain_waiting']:.4f}",
    ]
    if report.get("durations") == "hidden":
        lines.append("  durations hidden: time limits are user-style overestimates")
    eta = report.get("eta")
    if eta is not None:
        lines.append(
            f"  ETA error over {eta['jobs']} jobs that waited >= {eta['min_wait_s']:.0f} s: "
            f"median {eta['median_error']:.1%}, p90 {eta['p90_error']:.1%}; "
            f"{eta['within_band']:.1%} started inside their band, {eta['unknown']} unknown"
        )
    lines.extend(_counts(report))
    default = report["default_quota"]
    if default["teams"]:
        lines.append(
            f"  teams with no quota row, given {default['nodes']:g} node(s) of quota: "
            + ", ".join(default["teams"])
        )
    lines.append(
        "  team       weight  guar.  jobs   mean wait    share  entitled  fair ratio"
        + ("  excluded" if report["policy"] == "private" else "")
    )
    for name, team in report["teams"].items():
        ratio = "-" if team["fair_ratio"] is None else f"{team['fair_ratio']:.3f}"
        line = (
            f"  {name:<10} {team['weight']:>6g} {team['guaranteed_gpus']:>6} {team['jobs']:>5} "
            f"{team['mean_wait_s']:>11.0f} {team['share']:>8.4f} {team['entitlement']:>9.4f} "
            f"{ratio:>11}"
        )
        if "excluded_jobs" in team:
            line += f" {team['excluded_jobs']:>9}"
        lines.append(line)
    if "sharing_incentive" in report:
        lines.extend(_sharing_lines(report["sharing_incentive"]))
    return "\n".join(lines)


def _counts(report: Mapping[str, Any]) -> list[str]:
    parts = [f"{report.get('excluded_jobs', 0)} excluded (never fit)"]
    for key, label in (("unfinished_jobs", "never started"), ("failed_jobs", "failed")):
        if report.get(key):
            parts.append(f"{report[key]} {label}")
    parts.append(f"{report.get('passes', 0)} schedule() passes")
    if "ticks" in report:
        parts.append(f"{report['ticks']} ticks")
    parts.append(f"{report.get('wall_s', 0):.1f} s wall")
    return ["  " + ", ".join(parts)]


def _sharing_lines(sharing: Mapping[str, Any]) -> list[str]:
    verdict = "holds" if sharing["holds"] else "DOES NOT HOLD"
    lines = [
        f"  sharing incentive (mean wait <= {SHARING_FACTOR} x private + {SHARING_SLACK_S:.0f} s, "
        f"same jobs): {verdict}"
    ]
    for name, team in sharing["teams"].items():
        if team["holds"] is None:
            lines.append(f"    {name:<10} no job fits its private partition")
            continue
        mark = "ok" if team["holds"] else "FAILS"
        lines.append(
            f"    {name:<10} {team['mean_wait_s']:>10.0f} s vs private "
            f"{team['private_mean_wait_s']:>10.0f} s over {team['jobs']} jobs  {mark}"
        )
    return lines
