"""The small world the usage tests share (tests/portal/test_usage_report.py works its numbers
out by hand): team vision on 10 May 2024 at 06:00 UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from portal.accounting.models import UsageRecord
from portal.jobs.models import Allocation, JobState
from portal.jobs.testing import allocate, make_job, make_node, make_team, make_user
from portal.tenants.models import Membership

NOW = datetime(2024, 5, 10, 6, 0, tzinfo=UTC)


def at(day: int, hour: float, month: int = 5) -> datetime:
    return datetime(2024, month, day, tzinfo=UTC) + timedelta(hours=hour)


def usage_world(settings: Any) -> dict[str, Any]:
    """Team vision (guarantee 1, budget 100 GPU-unit-hours), on 10 May 2024 at 06:00 UTC:

    - alice, finished: an H100 (billed 2.0) from 8 May 22:00 to 9 May 01:00 (across midnight);
    - alice, running: an H100 since 9 May 23:00 (across midnight, up to now);
    - alice, finished: an MPS quarter from 10 May 01:30 to 01:45;
    - vera (team admin), finished: an A100 from 30 April 23:00 to 1 May 01:00 (ended in May:
      the budget counts it wholly in May; before the report's days);
    - vera, running: an A100 since 10 May 03:00;
    - bob of team nlp, running on an A100: never in vision's numbers.
    """
    settings.SCHEDULER = {**settings.SCHEDULER, "model_weights": {"NVIDIA H100": 2.0}}
    vision = make_team("vision", guaranteed_units=1.0, limit_units=4.0, budget_gpu_hours=100.0)
    nlp = make_team("nlp")
    people = {
        "vision": vision,
        "alice": make_user("alice", team=vision),
        "vera": make_user("vera", team=vision, role=Membership.Role.ADMIN),
        "bob": make_user("bob", team=nlp),
        "admin": make_user("admin", site_admin=True),
    }
    make_node(
        "node-a",
        gpus=[
            {"model": "NVIDIA H100"},
            {"model": "NVIDIA A100"},
            {"mode": "mps", "shares": 4},
            {"model": "NVIDIA A100"},
        ],
    )

    def hold(user: Any, key: str, start: datetime, end: datetime | None, units: float) -> None:
        state = JobState.RUNNING if end is None else JobState.SUCCEEDED
        team = vision if user != people["bob"] else nlp
        job = make_job(team=team, user=user, state=state)
        allocate(job, [key])
        Allocation.objects.filter(job=job).update(created_at=start, released_at=end)
        if end is not None:
            UsageRecord.objects.create(
                job=job,
                attempt=1,
                team=team,
                user=user,
                gpu_units=units,
                started_at=start,
                ended_at=end,
                unit_seconds=units * (end - start).total_seconds(),
            )

    alice, vera = people["alice"], people["vera"]
    hold(alice, "GPU-node-a-0", at(8, 22), at(9, 1), 2.0)
    hold(alice, "GPU-node-a-0", at(9, 23), None, 2.0)
    hold(alice, "GPU-node-a-2/mps/0", at(10, 1.5), at(10, 1.75), 0.25)
    hold(vera, "GPU-node-a-1", at(30, 23, month=4), at(1, 1), 1.0)
    hold(vera, "GPU-node-a-1", at(10, 3), None, 1.0)
    hold(people["bob"], "GPU-node-a-3", at(9, 0), None, 1.0)
    return people
