"""Where a replay loses fairness and utilisation: ``python scripts/diagnose_replay.py``.

Reads a replay's segments CSV (``python -m scheduler.sim ... --jobs-out SEGMENTS``) with the
trace and quota file it replayed, and recomputes, from the records alone and with the
definitions of ``scheduler.sim.metrics``:

- each team's time-averaged ratio (min(1, held / water-filled fair share) while it queues),
  its queued time split into short spells (under ``--short-s``, the latency of a pass, a
  reclaim's minimum run and grace) and long ones, and ``jain_waiting`` with and without the
  short spells and without each team;
- ``jain_waiting`` per window of simulated time;
- idle GPU-seconds while jobs wait, split by the smallest waiting job: one that fits the idle
  GPUs by count although it needs no whole node (1 GPU), one that needs whole nodes (8 or
  more GPUs) while at least that many GPUs are idle, and idle GPUs that no waiting job could
  use by count;
- work thrown away by preemption (victims' run time, grace included);
- what sets the makespan against its lower bound (the utilisation bound).

Example::

    python scripts/diagnose_replay.py --trace ../shared/traces/philly/jobs.csv \\
        --quotas ../shared/traces/philly/vc_quota_nodes.csv --gpus 512 --segments seg.csv
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.sim.cluster import build_teams  # noqa: E402
from scheduler.sim.metrics import (  # noqa: E402
    jain_index,
    makespan_lower_bound,
    share_ratio,
    share_sweep,
)
from scheduler.sim.records import JobRecord, Segment  # noqa: E402
from scheduler.sim.trace import TraceJob, load_quotas, load_trace  # noqa: E402

_EPSILON = 1e-9


def load_records(segments_csv: Path, durations: dict[str, float]) -> list[JobRecord]:
    rows: dict[str, list[dict[str, str]]] = defaultdict(list)
    with open(segments_csv, encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            rows[row["job_id"]].append(row)
    records = []
    for job_id, mine in rows.items():
        first = mine[0]
        segments = tuple(
            Segment(float(r["start_s"]), float(r["end_s"]), r["preempted"] == "1") for r in mine
        )
        records.append(
            JobRecord(
                job_id,
                first["tenant"],
                float(first["gpus"]),
                float(first["submit_s"]),
                durations[job_id],
                segments,
            )
        )
    return records


def _unstarted(trace_jobs: Sequence[TraceJob], seen: set[str]) -> list[JobRecord]:
    return [
        JobRecord(j.id, j.tenant, float(j.gpus), j.submit_s, j.duration_s)
        for j in trace_jobs
        if j.id not in seen
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--quotas")
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--segments", required=True, help="the replay's --jobs-out CSV")
    parser.add_argument("--limit-jobs", type=int)
    parser.add_argument(
        "--until",
        type=float,
        help="the segments are a replay cut at this simulated time (running jobs end there): "
        "leave out the jobs submitted later; the makespan lines then mean nothing",
    )
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--short-s", type=float, default=600.0)
    parser.add_argument(
        "--protected-run-s",
        type=float,
        default=3 * 24 * 3600.0,
        help="reclaim_max_run_s: jobs that ran this long are never reclaimed",
    )
    args = parser.parse_args(argv)

    trace_jobs = load_trace(args.trace, limit=args.limit_jobs)
    if args.until is not None:
        trace_jobs = [j for j in trace_jobs if j.submit_s <= args.until]
    durations = {j.id: j.duration_s for j in trace_jobs}
    records = load_records(Path(args.segments), durations)
    records += _unstarted(trace_jobs, {r.job_id for r in records})
    quotas = load_quotas(args.quotas) if args.quotas else None
    teams_spec = build_teams((r.tenant for r in records), quotas, args.gpus)
    weights = {n: t.weight for n, t in teams_spec.items()}
    guarantee = {n: float(t.guaranteed_gpus) for n, t in teams_spec.items()}
    capacity = float(args.gpus)

    teams = sorted({r.tenant for r in records})
    start = min(r.submit_s for r in records)
    last_submit = max(r.submit_s for r in records)
    window_len = (last_submit - start) / args.windows  # the last window runs to the end
    sizes: dict[str, Counter[float]] = {t: Counter() for t in teams}
    all_sizes: Counter[float] = Counter()
    ratio_s = dict.fromkeys(teams, 0.0)
    queued_s = dict.fromkeys(teams, 0.0)
    short_ratio_s = dict.fromkeys(teams, 0.0)
    short_queued_s = dict.fromkeys(teams, 0.0)
    spell_ratio = dict.fromkeys(teams, 0.0)
    spell_len = dict.fromkeys(teams, 0.0)
    under_with_idle_s = dict.fromkeys(teams, 0.0)  # below share while a job of its fits idle
    within_guarantee_s = dict.fromkeys(teams, 0.0)  # its smallest job fits its guarantee
    bigger_than_share_s = dict.fromkeys(teams, 0.0)  # held + its smallest job > fair share
    held_q = dict.fromkeys(teams, 0.0)  # held, integrated while queued
    fair_q = dict.fromkeys(teams, 0.0)  # fair share, integrated while queued
    win_ratio: list[dict[str, float]] = [defaultdict(float) for _ in range(args.windows)]
    win_queued: list[dict[str, float]] = [defaultdict(float) for _ in range(args.windows)]
    win_idle = [0.0] * args.windows  # idle GPU-seconds while jobs wait
    idle: dict[str, float] = defaultdict(float)
    # The shortfall of queued teams below their fair share, and who holds the excess.
    running: dict[str, dict[str, tuple[float, float]]] = {t: {} for t in teams}
    # Per team, GPU-seconds below its fair share while queued, and of those while it held
    # less than its guarantee; GPU-seconds held above fair share while others are short.
    deficit: dict[str, float] = defaultdict(float)
    deficit_in_guar: dict[str, float] = defaultdict(float)
    excess: dict[str, float] = defaultdict(float)

    def close_spell(team: str) -> None:
        if spell_len[team] < args.short_s:
            short_ratio_s[team] += spell_ratio[team]
            short_queued_s[team] += spell_len[team]
        spell_ratio[team] = spell_len[team] = 0.0

    # The metrics' sweep, with the sizes of the waiting jobs and the running jobs' starts.
    for span in share_sweep(records, weights, capacity):
        time, team, d_held, d_queued, job_id = span.change
        elapsed, previous = span.elapsed, span.start
        held, queued, fair = span.held, span.queued, span.fair
        if elapsed > 0:
            free = capacity - sum(held.values())
            window = min(args.windows - 1, int((previous - start) / window_len))
            idle["total"] += free * elapsed
            waiting = [s for s, c in all_sizes.items() if c > 0]
            if waiting and free > _EPSILON:
                smallest = min(waiting)
                idle["while_queued"] += free * elapsed
                win_idle[window] += free * elapsed
                if smallest <= free + _EPSILON:
                    if smallest < 8:
                        idle["sub_node_job_fits_by_count"] += free * elapsed
                        if smallest <= 1:
                            idle["one_gpu_job_fits"] += free * elapsed
                    else:
                        idle["only_node_gangs_fit_by_count"] += free * elapsed
                else:
                    idle["no_waiting_job_fits_by_count"] += free * elapsed
            short_total = 0.0
            for t in teams:
                if queued[t] > _EPSILON and fair[t] > held[t] + _EPSILON:
                    gap = fair[t] - held[t]
                    short_total += gap
                    deficit[t] += gap * elapsed
                    if held[t] < guarantee[t] - _EPSILON:
                        deficit_in_guar[t] += gap * elapsed
            if short_total > _EPSILON:
                excess["short_total"] += short_total * elapsed
                excess["idle_while_short"] += min(free, short_total) * elapsed
                for t in teams:
                    over = held[t] - fair[t]
                    if over <= _EPSILON:
                        continue
                    for job_start, units in sorted(running[t].values(), reverse=True):
                        take = min(units, over) * elapsed
                        if previous - job_start >= args.protected_run_s:
                            excess["by_jobs_past_reclaim_max_run"] += take
                        elif held[t] > guarantee[t] + _EPSILON:
                            excess["by_teams_above_guarantee"] += take
                        else:
                            excess["by_teams_within_guarantee"] += take
                        over -= units
                        if over <= _EPSILON:
                            break
            for t in teams:
                if queued[t] > _EPSILON:
                    ratio = share_ratio(held[t], fair[t])
                    ratio_s[t] += ratio * elapsed
                    queued_s[t] += elapsed
                    spell_ratio[t] += ratio * elapsed
                    spell_len[t] += elapsed
                    win_ratio[window][t] += ratio * elapsed
                    win_queued[window][t] += elapsed
                    mine = [s for s, c in sizes[t].items() if c > 0]
                    if ratio < 1.0 - _EPSILON and mine and min(mine) <= free + _EPSILON:
                        under_with_idle_s[t] += elapsed
                    if mine and held[t] + min(mine) <= guarantee[t] + _EPSILON:
                        within_guarantee_s[t] += elapsed
                    if mine and ratio < 1.0 - _EPSILON and held[t] + min(mine) > fair[t] + _EPSILON:
                        bigger_than_share_s[t] += elapsed
                    held_q[t] += held[t] * elapsed
                    fair_q[t] += fair[t] * elapsed
        units = abs(d_held) if d_held else abs(d_queued)
        if d_held > 0:
            running[team][job_id] = (time, units)
        elif d_held < 0:
            running[team].pop(job_id, None)
        if d_queued > 0:
            sizes[team][units] += 1
            all_sizes[units] += 1
        elif d_queued < 0:
            sizes[team][units] -= 1
            all_sizes[units] -= 1
        if queued[team] > _EPSILON and queued[team] + d_queued <= _EPSILON:
            close_spell(team)
    for t in teams:
        close_spell(t)

    ratios = {t: ratio_s[t] / queued_s[t] for t in teams if queued_s[t] > 0}
    long_ratios = {
        t: (ratio_s[t] - short_ratio_s[t]) / (queued_s[t] - short_queued_s[t])
        for t in teams
        if queued_s[t] - short_queued_s[t] > 0
    }
    jain = jain_index(list(ratios.values()))
    print(f"jain_waiting {jain:.4f} over {len(ratios)} teams")
    print(
        f"jain over long spells only (>= {args.short_s:.0f} s): "
        f"{jain_index(list(long_ratios.values())):.4f} over {len(long_ratios)} teams"
    )
    waits: dict[str, list[float]] = defaultdict(list)
    jobs_of: dict[str, list[JobRecord]] = defaultdict(list)
    for r in records:
        jobs_of[r.tenant].append(r)
        if r.finished:
            waits[r.tenant].append(r.wait_s)
    print(
        "\nteam     guar  jobs  >guar  ratio  long   queued_h  short_h  under&fits_h  "
        "in_guar_h  >share_h  held/fair  short_kGPUh (in guar)  mean_wait_s  jain_without"
    )
    for t in sorted(ratios, key=lambda name: ratios[name]):
        others = [v for n, v in ratios.items() if n != t]
        big = sum(1 for r in jobs_of[t] if r.gpus > guarantee[t])
        mean_wait = sum(waits[t]) / len(waits[t]) if waits[t] else math.nan
        print(
            f"{t}  {guarantee[t]:4.0f} {len(jobs_of[t]):5d} {big:5d}  {ratios[t]:.3f}  "
            f"{long_ratios.get(t, math.nan):.3f}  {queued_s[t] / 3600:9.1f}  "
            f"{short_queued_s[t] / 3600:7.1f}  {under_with_idle_s[t] / 3600:12.1f}  "
            f"{within_guarantee_s[t] / 3600:9.1f}  {bigger_than_share_s[t] / 3600:7.1f}  "
            f"{held_q[t] / queued_s[t]:4.0f}/{fair_q[t] / queued_s[t]:<4.0f}  "
            f"{deficit[t] / 3.6e6:8.1f} ({deficit_in_guar[t] / 3.6e6:6.1f})  "
            f"{mean_wait:11.0f}  {jain_index(others):.4f}"
        )
    print("\nwindow (days)        jain   teams  idle_GPUh_while_queued  lowest three")
    for w in range(args.windows):
        wr = {t: win_ratio[w][t] / q for t, q in win_queued[w].items() if q > 0}
        low = sorted(wr.items(), key=lambda item: item[1])[:3]
        a = (start + w * window_len) / 86400
        b = (start + (w + 1) * window_len) / 86400
        print(
            f"{a:6.1f} - {b:6.1f}   {jain_index(list(wr.values())):.4f}  {len(wr):5d}  "
            f"{win_idle[w] / 3600:22.0f}  " + ", ".join(f"{t} {v:.2f}" for t, v in low)
        )

    print("\nidle GPU-hours")
    for key in (
        "total",
        "while_queued",
        "one_gpu_job_fits",
        "sub_node_job_fits_by_count",
        "only_node_gangs_fit_by_count",
        "no_waiting_job_fits_by_count",
    ):
        print(f"  {key:32s} {idle[key] / 3600:12.0f}")

    print("\nshortfall below fair share (GPU-hours) and who held the excess")
    for key in (
        "short_total",
        "idle_while_short",
        "by_jobs_past_reclaim_max_run",
        "by_teams_above_guarantee",
        "by_teams_within_guarantee",
    ):
        print(f"  {key:32s} {excess[key] / 3600:12.0f}")

    lost: dict[str, float] = defaultdict(float)
    victims = Counter[str]()
    for r in records:
        for s in r.segments:
            if s.preempted:
                lost[r.tenant] += r.gpus * (s.end_s - s.start_s)
                victims[r.tenant] += 1
    print(
        f"\npreemptions {sum(victims.values())}, GPU-hours thrown away "
        f"{sum(lost.values()) / 3600:.0f}: "
        + ", ".join(f"{t} {victims[t]} ({lost[t] / 3600:.0f})" for t, _ in victims.most_common(6))
    )

    done = [r for r in records if r.finished]
    first = min(r.submit_s for r in done)
    lower = makespan_lower_bound(done, capacity)
    work = sum(r.work for r in done)
    last = max(done, key=lambda r: r.end_s)
    longest = max(done, key=lambda r: r.submit_s + r.duration_s)
    print(
        f"\nmakespan {(last.end_s - first) / 3600:.1f} h, lower bound {(lower - first) / 3600:.1f} h "
        f"({(lower - first) / (last.end_s - first):.1%}); work {work / 3600:.0f} GPU-h"
    )
    print(
        f"  last to end: {last.job_id} team {last.tenant} {last.gpus:g} GPUs submit "
        f"{last.submit_s / 3600:.1f} h, first start {last.segments[0].start_s / 3600:.1f} h, "
        f"duration {last.duration_s / 3600:.1f} h, {len(last.segments)} segment(s)"
    )
    print(
        f"  max(submit + duration): {longest.job_id} {(longest.submit_s + longest.duration_s - first) / 3600:.1f} h"
    )
    late = sorted(done, key=lambda r: -r.end_s)[:8]
    for r in late:
        print(
            f"  {r.job_id} {r.tenant} {r.gpus:g} GPUs submit {r.submit_s / 3600:.1f} h "
            f"start {r.segments[-1].start_s / 3600:.1f} h end {r.end_s / 3600:.1f} h "
            f"duration {r.duration_s / 3600:.1f} h segments {len(r.segments)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
