"""The checks of a chaos run, judged against what really ran (the jobs' own records).

Pure functions over what the harness collected: the ground truth (`truth.Truth`), rows read
from the database, the fault schedule. Each returns a `Check`: passed, failed, or skipped
with the reason (a check that cannot be made is never reported as a pass).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from .faults import AGENT_FAULTS, MESSAGE_FAULTS, Fault
from .truth import Execution, Truth

# An agent fault is "quiet" when no control-plane fault falls this close to it (seconds).
QUIET_BEFORE_S = 15.0
QUIET_AFTER_S = 30.0

FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")
# FAILED for one of these reasons is expected under chaos and reported apart.
ALLOWED_FAILURES = {"retries exhausted": re.compile(r"PORTAL_JOB_MAX_RETRIES")}
# A violation is shown with the faults of the seconds before it (the likely causes).
RECENT_FAULT_S = 30.0


@dataclass
class Check:
    name: str
    passed: bool | None  # None: could not be checked (skipped), with the reason in summary
    summary: str
    details: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "FAIL", None: "SKIP"}[self.passed]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


@dataclass(frozen=True)
class JobRow:
    id: int
    name: str
    state: str
    attempt: int
    reason: str


@dataclass(frozen=True)
class AllocationRow:
    slice: str
    job_id: int
    attempt: int
    created_at: float
    released_at: float | None


def check_all_final(
    *, planned: list[str], submitted: dict[str, int], jobs: dict[int, JobRow]
) -> Check:
    """Every planned job was submitted and reached a final state; FAILED only for a listed
    reason."""
    details = [f"{name}: never submitted" for name in planned if name not in submitted]
    states = Counter(row.state for row in jobs.values())
    allowed: Counter[str] = Counter()
    for row in sorted(jobs.values(), key=lambda r: r.id):
        if row.state not in FINAL_STATES:
            details.append(f"job {row.id}: still {row.state} (attempt {row.attempt})")
        elif row.state == "FAILED":
            why = next((k for k, rx in ALLOWED_FAILURES.items() if rx.search(row.reason)), None)
            if why:
                allowed[why] += 1
            else:
                details.append(f"job {row.id}: FAILED: {row.reason}")
    counts = ", ".join(f"{state} {n}" for state, n in sorted(states.items()))
    extra = "".join(f"; FAILED for {why}: {n}" for why, n in allowed.items())
    return Check(
        "every job final",
        not details,
        f"{len(submitted)}/{len(planned)} submitted; {counts or 'no jobs'}{extra}",
        details,
    )


def check_attempt_started_once(truth: Truth) -> Check:
    starts = Counter((e.job_id, e.attempt) for e in truth.executions)
    twice = sorted(key for key, n in starts.items() if n > 1)
    details = [f"job {job} attempt {attempt}: started {starts[(job, attempt)]} times"
               for job, attempt in twice]  # fmt: skip
    return Check(
        "no attempt started twice",
        not twice,
        f"{len(starts)} attempts started; {len(twice)} started more than once",
        details,
    )


@dataclass(frozen=True)
class Overlap:
    job_id: int
    earlier: Execution
    later: Execution
    seconds: float
    faults: list[str]


def find_overlaps(truth: Truth, faults: list[Fault]) -> list[Overlap]:
    """Pairs of executions of one job where the later started while the earlier was
    certainly still running (alive at a line or a sighting after the later's start)."""
    overlaps = []
    for job_id, runs in truth.by_job().items():
        for i, later in enumerate(runs):
            for earlier in runs[:i]:
                if earlier.alive_until > later.started:
                    between = [
                        f"#{f.index + 1} {f.kind} {f.target}"
                        for f in faults
                        if f.injected_at is not None
                        and later.started - RECENT_FAULT_S <= f.injected_at <= later.started
                    ]
                    overlaps.append(
                        Overlap(
                            job_id, earlier, later, earlier.alive_until - later.started, between
                        )
                    )
    return overlaps


def check_no_overlap(overlaps: list[Overlap], workdirs: dict[str, str]) -> Check:
    details = []
    for o in overlaps:
        details.append(
            f"job {o.job_id}: attempt {o.later.attempt} on {o.later.node(workdirs)} started "
            f"while attempt {o.earlier.attempt} on {o.earlier.node(workdirs)} ran on for "
            f"{o.seconds:.1f} s more (it ended: {o.earlier.how_it_ended}); faults in the "
            f"{RECENT_FAULT_S:.0f} s before: {', '.join(o.faults[-4:]) or 'none'}"
        )
    jobs = {o.job_id for o in overlaps}
    return Check(
        "no overlapping executions",
        not overlaps,
        f"{len(overlaps)} overlapping pairs in {len(jobs)} jobs",
        details,
    )


def check_completed_once(truth: Truth, lease_losses: dict[tuple[int, int], float]) -> Check:
    """No job ran to its end twice, except one way the design accepts and says so: an attempt
    ran to its end while its node was cut off (paused, dead), the node's lease expired before
    the result could reach the portal, and the portal requeued the job. At most once holds per
    attempt; the job itself ran again because its first result was stranded. Those are
    counted apart (`lease_losses`: (job, attempt) -> when the portal declared the attempt lost
    because its node's lease expired)."""
    ends = Counter(e.job_id for e in truth.executions if e.end is not None)
    twice = sorted(job for job, n in ends.items() if n > 1)
    details = []
    stranded = 0
    unexplained = 0
    for job in twice:
        completed = sorted(
            (e for e in truth.by_job()[job] if e.end is not None), key=lambda e: e.end or 0.0
        )
        attempts = [e.attempt for e in completed]
        explained = all(
            (e.job_id, e.attempt) in lease_losses
            and (e.end or 0.0) <= lease_losses[(e.job_id, e.attempt)]
            for e in completed[:-1]
        )
        if explained:
            stranded += 1
            details.append(
                f"job {job}: ran to its end {ends[job]} times (attempts {attempts}); the earlier "
                "result was stranded on a node whose lease then expired (accepted, see above)"
            )
        else:
            unexplained += 1
            details.append(f"job {job}: ran to its end {ends[job]} times (attempts {attempts})")
    return Check(
        "no job completed twice",
        unexplained == 0,
        f"{len(ends)} jobs ran to their end; {unexplained} of them more than once; "
        f"{stranded} again after a result was stranded behind an expired lease",
        details,
    )


def check_succeeded_matches_truth(truth: Truth, jobs: dict[int, JobRow]) -> Check:
    """A SUCCEEDED job's attempt wrote `end`; a job that wrote `end` is SUCCEEDED."""
    ended: dict[int, set[int]] = {}
    for e in truth.executions:
        if e.end is not None:
            ended.setdefault(e.job_id, set()).add(e.attempt)
    details = []
    succeeded = [row for row in jobs.values() if row.state == "SUCCEEDED"]
    for row in sorted(succeeded, key=lambda r: r.id):
        if row.attempt not in ended.get(row.id, set()):
            seen = sorted(ended.get(row.id, set()))
            details.append(
                f"job {row.id}: SUCCEEDED with attempt {row.attempt}, but no execution of that "
                f"attempt ran to its end (ended attempts: {seen or 'none'})"
            )
    for job_id in sorted(ended):
        row = jobs.get(job_id)
        if row is not None and row.state != "SUCCEEDED":
            details.append(
                f"job {job_id}: attempt(s) {sorted(ended[job_id])} ran to their end, but the "
                f"portal says {row.state} ({row.reason or 'no reason'})"
            )
    return Check(
        "portal's result matches what ran",
        not details,
        f"{len(succeeded)} SUCCEEDED jobs compared with their executions",
        details,
    )


def check_no_double_booking(allocations: list[AllocationRow]) -> Check:
    per_slice: dict[str, list[AllocationRow]] = {}
    for row in allocations:
        per_slice.setdefault(row.slice, []).append(row)
    details = []
    for key, rows in sorted(per_slice.items()):
        rows.sort(key=lambda r: r.created_at)
        for before, after in zip(rows, rows[1:], strict=False):
            end = before.released_at if before.released_at is not None else float("inf")
            if after.created_at < end:
                details.append(
                    f"slice {key}: job {after.job_id}#{after.attempt} booked at "
                    f"{after.created_at:.3f} while job {before.job_id}#{before.attempt} held it "
                    f"until {'never released' if before.released_at is None else f'{end:.3f}'}"
                )
    return Check(
        "no slice double-booked",
        not details,
        f"{len(allocations)} allocations on {len(per_slice)} slices",
        details,
    )


LINE_RE = re.compile(r"^chaos-line job=(\d+) attempt=(\d+) (\d+)/(\d+)$")


def check_logs_complete(
    jobs: dict[int, JobRow], logs: dict[int, str], expected_lines: dict[int, int]
) -> Check:
    """Each SUCCEEDED job's shipped log (its final attempt) holds lines 1..M, in order, once."""
    details = []
    succeeded = [row for row in jobs.values() if row.state == "SUCCEEDED"]
    for row in sorted(succeeded, key=lambda r: r.id):
        wanted = expected_lines.get(row.id)
        numbers = []
        for line in logs.get(row.id, "").splitlines():
            match = LINE_RE.match(line.strip())
            if match and int(match.group(1)) == row.id:
                if int(match.group(2)) != row.attempt:
                    details.append(f"job {row.id}: log has a line of attempt {match.group(2)}")
                    break
                numbers.append(int(match.group(3)))
        if wanted is not None and numbers != list(range(1, wanted + 1)):
            missing = sorted(set(range(1, wanted + 1)) - set(numbers))
            details.append(
                f"job {row.id}: log has {len(numbers)} of {wanted} lines"
                + (f", missing {missing[:10]}" if missing else ", out of order or repeated")
            )
    return Check(
        "logs complete and in order",
        not details,
        f"{len(succeeded)} SUCCEEDED jobs' logs read",
        details,
    )


def check_outbox(outbox: dict[str, int | None]) -> Check:
    """Every report acknowledged: the agents' outbox directories are empty at the end."""
    missing = sorted(node for node, n in outbox.items() if n is None)
    if len(missing) == len(outbox):
        return Check(
            "every report acknowledged",
            None,
            "no outbox on this agent version (no <workdir>/outbox/ on any agent): not checked",
        )
    details = [f"{node}: {n} reports never acknowledged" for node, n in outbox.items() if n]
    details += [f"{node}: no outbox directory" for node in missing]
    return Check(
        "every report acknowledged",
        not details,
        f"{sum(n or 0 for n in outbox.values())} reports left in "
        f"{len(outbox) - len(missing)} outboxes",
        details,
    )


def check_no_stray_processes(stray: list[Execution], workdirs: dict[str, str]) -> Check:
    details = [
        f"job {e.job_id} attempt {e.attempt} (pid {e.pid} on {e.node(workdirs)}) still running"
        for e in stray
    ]
    return Check(
        "no job process left running",
        not stray,
        f"{len(stray)} job processes still running after every job was final",
        details,
    )


def check_no_process_died(died: list[dict[str, Any]]) -> Check:
    """No portal process exited without a fault killing it (a crash under chaos is a bug)."""
    details = [
        f"{d['process']} exited with code {d['exit_code']}; last line: "
        f"{(d['last_lines'] or ['(none)'])[-1]}"
        for d in died
    ]
    return Check(
        "no portal process died on its own",
        not died,
        f"{len(died)} unexpected exits (each restarted)",
        details,
    )


# --- measured figures ------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeChange:
    at: float
    node: str
    state: str


def recovery_figures(
    *,
    faults: list[Fault],
    changes: list[NodeChange],
    truth: Truth,
    workdirs: dict[str, str],
) -> dict[str, Any]:
    """For each agent kill or pause: seconds from the fault to the node marked lost, and to
    each of its running jobs starting again (anywhere). The `quiet_` figures keep only the
    agent faults with no control-plane fault (a worker, beat, lease worker or web kill, a
    Redis or PostgreSQL restart) from `QUIET_BEFORE_S` before to `QUIET_AFTER_S` after: what
    detection and requeue take when the portal itself is up, the case the targets are for."""
    to_lost: list[float] = []
    to_rerun: list[float] = []
    quiet_lost: list[float] = []
    quiet_rerun: list[float] = []
    never_lost = 0
    per_fault = []
    by_job = truth.by_job()
    for fault in faults:
        if fault.kind not in AGENT_FAULTS or fault.injected_at is None:
            continue
        t0 = fault.injected_at
        # Until the next fault on the same node, whatever happens to it is this fault's doing.
        until = min(
            (f.injected_at for f in faults
             if f.target == fault.target and f.injected_at is not None and f.injected_at > t0),
            default=float("inf"),
        )  # fmt: skip
        lost_at = next(
            (c.at for c in changes
             if c.node == fault.target and t0 <= c.at < until and c.state == "lost"),
            None,
        )  # fmt: skip
        quiet = not any(
            f.kind not in AGENT_FAULTS + MESSAGE_FAULTS
            and f.injected_at is not None
            and t0 - QUIET_BEFORE_S <= f.injected_at <= t0 + QUIET_AFTER_S
            for f in faults
        )
        if lost_at is None:
            never_lost += 1
        else:
            to_lost.append(lost_at - t0)
            if quiet:
                quiet_lost.append(lost_at - t0)
        affected = [
            e
            for e in truth.executions
            if e.node(workdirs) == fault.target
            and e.started <= t0
            and (e.dead_by is None or e.dead_by > t0)
        ]
        reruns = {}
        for e in affected:
            nxt = next((r for r in by_job[e.job_id] if r.started > t0), None)
            if nxt is not None:
                reruns[e.job_id] = round(nxt.started - t0, 3)
                to_rerun.append(nxt.started - t0)
                if quiet:
                    quiet_rerun.append(nxt.started - t0)
        per_fault.append(
            {
                "fault": fault.index + 1,
                "kind": fault.kind,
                "node": fault.target,
                "quiet": quiet,
                "to_lost_s": None if lost_at is None else round(lost_at - t0, 3),
                "jobs_running": [e.job_id for e in affected],
                "to_running_again_s": reruns,
            }
        )
    return {
        "fault_to_node_lost_s": _spread(to_lost),
        "node_back_before_marked_lost": never_lost,
        "fault_to_job_running_again_s": _spread(to_rerun),
        "quiet_fault_to_node_lost_s": _spread(quiet_lost),
        "quiet_fault_to_job_running_again_s": _spread(quiet_rerun),
        "per_fault": per_fault,
    }


def _spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "min": None, "median": None, "p90": None, "max": None}
    ordered = sorted(values)
    return {
        "n": len(values),
        "min": round(ordered[0], 2),
        "median": round(statistics.median(ordered), 2),
        "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 2),
        "max": round(ordered[-1], 2),
    }
