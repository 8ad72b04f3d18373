"""How long each main page takes to render, and how many queries it costs, on a big cluster:
the core benchmark's world (``bench/core_pass.py``: 1,000 nodes x 8 GPUs, whole, MIG and
MPS, about nine in ten slices held by running jobs, 10,000 pending jobs of 20 teams), written
by ``bench/db_pass.py``'s loader into a scratch database (PostgreSQL next to DATABASE_URL's,
or a temporary SQLite file) and dropped afterwards.

Before timing, the world is brought to where a portal would have it: one real scheduling
pass (``run_schedule_pass``: queue positions, explanations, the fair-share standing the
Fair share page reads; its messages to agents captured, not sent), then ``--ended`` of the
running jobs end through the agents' own path (``attempt_finish``: slices freed, use
charged), every fourth one failed, so the job list, the usage page and a finished job's page
have history.

Each page is fetched with Django's test client as each kind of user: a member of a team
(``team00``), that team's admin, and a site admin (also a member of ``team00``, so the same
pages apply). Per page and user: the median and the slowest of ``--repeats`` renders (ms,
the whole request through the middleware) and the query count of one more render. The
what-if (the submit form's live box) is asked with the snapshot cache cleared each time,
its worst case.

``python -m bench.pages [--repeats N] [--ended N] [--only what-if,cluster] [--json PATH]``
prints a table (for the what-if also where a fresh one spends its time: loading the snapshot
and ``schedule()``); ``make bench-pages`` runs it (about ten minutes: building the world takes
two to four).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

TEAM = "team00"
ENDED = 2_000
PEOPLE = ("member", "team admin", "site admin")


def run(repeats: int = 5, ended: int = ENDED, only: str = "") -> dict[str, Any]:
    import django

    django.setup()
    from django.core.management import call_command

    from bench.core_pass import build_snapshot
    from bench.db_pass import _populate, _scratch_database

    with _scratch_database() as vendor:
        call_command("migrate", verbosity=0, interactive=False)
        now = datetime.now(tz=UTC).replace(microsecond=0)
        began = time.perf_counter()
        sizes = _populate(now, build_snapshot())
        world = _bring_to_life(now, ended)
        build_s = time.perf_counter() - began
        people = _people()
        pages = _pages(people)
        rows = []
        for page in pages:
            if only and not any(part.strip() in page.name for part in only.split(",")):
                continue
            for who in PEOPLE:
                if who in page.who:
                    rows.append(_measure(page, who, people[who], repeats))
                    print(_row(rows[-1]), flush=True)
    return {
        "database": vendor,
        "world": {**sizes, **world, "build_s": round(build_s, 1)},
        "repeats": repeats,
        "pages": rows,
    }


# --- the world, as a running portal would have it ----------------------------------------------


def _bring_to_life(now: datetime, ended: int) -> dict[str, Any]:
    from portal.agents.testing import capture_sent_messages
    from portal.jobs.attempts import attempt_finish
    from portal.jobs.models import Job, JobState
    from portal.scheduling.service import run_schedule_pass

    with capture_sent_messages():
        result = run_schedule_pass(now=now)
        assert result.status == "ran", result.status
        running = list(
            Job.objects.filter(state=JobState.RUNNING, stop_requested_at__isnull=True)
            .order_by("pk")
            .values_list("pk", "node__name", "started_at")[:ended]
        )
        for number, (pk, node, started_at) in enumerate(running):
            failed = number % 4 == 3
            finished_at = min(now, started_at + timedelta(minutes=10 + number % 50))
            attempt_finish(
                job_id=pk,
                attempt=1,
                outcome="failed" if failed else "succeeded",
                node=node,
                exit_code=1 if failed else 0,
                error="exited with code 1" if failed else "",
                finished_at=finished_at,
                started_at=None,
                now=now,
            )
    counts = {
        state: Job.objects.filter(state=state).count()
        for state in (JobState.PENDING, JobState.ASSIGNED, JobState.RUNNING)
    }
    return {
        "jobs": Job.objects.count(),
        "pending_after_pass": counts[JobState.PENDING],
        "assigned_by_pass": counts[JobState.ASSIGNED],
        "running_after_ends": counts[JobState.RUNNING],
        "ended": Job.objects.filter(finished_at__isnull=False).count(),
    }


def _people() -> dict[str, Any]:
    """The member, the team admin (``team00``'s first member, made admin) and a site admin."""
    from django.contrib.auth import get_user_model

    from portal.tenants.models import Membership, Team

    team = Team.objects.get(name=TEAM)
    members = list(Membership.objects.filter(team=team).order_by("user__username"))
    assert len(members) >= 2, "the core world has several users per team"
    Membership.objects.filter(pk=members[0].pk).update(role=Membership.Role.ADMIN)
    site_admin = get_user_model().objects.create_user(
        "bench-admin", password="!", is_staff=True, is_superuser=True
    )
    Membership.objects.create(team=team, user=site_admin)
    return {"team admin": members[0].user, "member": members[1].user, "site admin": site_admin}


class Page:
    def __init__(
        self, name: str, path: str, *, who: tuple[str, ...] = PEOPLE, post: dict[str, Any] | None
    ) -> None:
        self.name, self.path, self.who, self.post = name, path, who, post


def _pages(people: dict[str, Any]) -> list[Page]:
    from portal.jobs.models import Job, JobState

    team_jobs = Job.objects.filter(team__name=TEAM, user=people["member"]).order_by("pk")
    running = team_jobs.filter(state=JobState.RUNNING).first()
    pending = team_jobs.filter(state=JobState.PENDING).first()
    failed = team_jobs.filter(state=JobState.FAILED).first()
    assert running and pending and failed, "the member has a running, a pending and a failed job"
    whatif = {
        "team": TEAM,
        "gpu_kind": "whole",
        "gpu_count": "1",
        "priority": "normal",
        "preemptible": "on",
    }

    def get(name: str, path: str, **kw: Any) -> Page:
        return Page(name, path, post=None, **kw)

    return [
        get("job list", "/"),
        get("job list, mine only", "/?mine=1"),
        get("job list, pending, page 3", "/?state=PENDING&page=3"),
        get("job list, name search", "/?q=j12"),
        get("job (running)", f"/jobs/{running.pk}/"),
        get("job (pending)", f"/jobs/{pending.pk}/"),
        get("job (failed)", f"/jobs/{failed.pk}/"),
        get("submit form", "/jobs/new/"),
        Page("what-if (fresh snapshot)", "/jobs/new/what-if/", post=whatif),
        get("teams", "/teams/"),
        get("team", f"/teams/{TEAM}/"),
        get("usage", f"/usage/?team={TEAM}"),
        get("cluster", "/cluster/"),
        get("cluster, page 20", "/cluster/?page=20"),
        get("fair share", "/fairshare/"),
        get("tokens", "/tokens/"),
        get("notifications", "/settings/notifications/"),
        get("nodes", "/nodes/", who=("site admin",)),
    ]


def _measure(page: Page, who: str, user: Any, repeats: int) -> dict[str, Any]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from portal.scheduling import whatif

    client = Client()
    client.force_login(user)

    def fetch() -> Any:
        if page.post is not None:
            whatif.clear_snapshot_cache()
            return client.post(page.path, page.post)
        return client.get(page.path)

    first = _timed(fetch)  # the first render warms template and URL caches
    assert first[1].status_code == 200, (page.path, who, first[1].status_code)
    times = [_timed(fetch)[0] for _ in range(repeats)]
    with CaptureQueriesContext(connection) as queries:
        fetch()
    parts = _whatif_parts(page.post, user) if page.post is not None else {}
    return {
        "page": page.name,
        "path": page.path,
        "as": who,
        "median_ms": round(statistics.median(times), 1),
        "max_ms": round(max(times), 1),
        "first_ms": round(first[0], 1),
        "queries": len(queries.captured_queries),
        "bytes": len(first[1].content),
        **parts,
    }


def _whatif_parts(form: dict[str, Any], user: Any) -> dict[str, float]:
    """Where a fresh what-if spends its time: loading the snapshot, and ``schedule()``."""
    from portal.jobs.validation import validate_job_request
    from portal.scheduling import whatif

    request = validate_job_request(
        {
            "name": "what-if",
            "team": form["team"],
            "image": "python:3.11-slim",
            "command": ["true"],
            "gpu": {"kind": form["gpu_kind"], "count": int(form["gpu_count"])},
        },
        user=user,
    )
    whatif.clear_snapshot_cache()
    answer = whatif.what_if(request=request, user=user)
    return {"load_ms": round(answer.load_ms, 1), "decide_ms": round(answer.decide_ms, 1)}


def _timed(fetch: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    response = fetch()
    return (time.perf_counter() - began) * 1000, response


def render_table(results: dict[str, Any]) -> str:
    world = results["world"]
    lines = [
        f"world ({results['database']}): {world['nodes']:,} nodes, {world['gpus']:,} GPUs, "
        f"{world['slices']:,} slices, {world['jobs']:,} jobs ({world['pending_after_pass']:,} "
        f"pending, {world['running_after_ends']:,} running, {world['assigned_by_pass']:,} "
        f"assigned by the pass, {world['ended']:,} ended); built in {world['build_s']} s",
        f"median and slowest of {results['repeats']} renders, queries of one render",
        "",
        f"{'page':<28} {'as':<11} {'median ms':>9} {'max ms':>8} {'queries':>7}",
    ]
    lines += [_row(row) for row in results["pages"]]
    return "\n".join(lines)


def _row(row: dict[str, Any]) -> str:
    parts = (
        f"  (load {row['load_ms']:.0f} ms, schedule() {row['decide_ms']:.0f} ms)"
        if "load_ms" in row
        else ""
    )
    return (
        f"{row['page']:<28} {row['as']:<11} {row['median_ms']:>9.1f} "
        f"{row['max_ms']:>8.1f} {row['queries']:>7}{parts}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pages", description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ended", type=int, default=ENDED, help="running jobs ended first")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--only", default="", help="only the pages whose name contains one of these (a,b)"
    )
    args = parser.parse_args(argv)
    results = run(repeats=args.repeats, ended=args.ended, only=args.only)
    print(render_table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
