"""Speed of the submit form's what-if (``portal.scheduling.whatif.what_if``) on a mid-size
cluster: 100 nodes x 8 GPUs (6 whole, 1 MIG with 4 instances, 1 in MPS mode with 4 shares),
three in four whole GPUs held by running jobs, 1,000 pending jobs of 8 teams.

Written to a scratch database like ``bench/db_pass.py`` (PostgreSQL next to DATABASE_URL's,
or a temporary SQLite file) and dropped afterwards. Timed, each ``--repeats`` times:

- ``fresh``: the snapshot loaded for the question (``now=`` given, as when the kept snapshot
  is stale), then ``schedule()`` with the candidate;
- ``kept``: the snapshot kept from the question before (the form's next question within
  ``SNAPSHOT_TTL_S`` while no pass ran): ``schedule()`` and the answer only.

The request: one whole GPU for a team above its guarantee (it waits: every free whole GPU is
taken by jobs ahead). ``python -m bench.whatif [--repeats N]`` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

NODES = 100
WHOLE_PER_NODE = 6
PENDING = 1_000
TEAMS = 8
USERS_PER_TEAM = 4
HELD_SHARE = 0.75
SEED = 11


def run(repeats: int = 10) -> dict[str, Any]:
    import django

    django.setup()
    from django.core.management import call_command

    from bench.db_pass import _scratch_database

    with _scratch_database() as vendor:
        call_command("migrate", verbosity=0, interactive=False)
        now = datetime.now(tz=UTC).replace(microsecond=0)
        sizes = _populate(now)
        figures = _time(now, repeats)
    return {"database": vendor, **sizes, **figures}


def _populate(now: datetime) -> dict[str, int]:
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from portal.cluster.models import Gpu, Node, Slice
    from portal.jobs.models import Allocation, Job, JobState
    from portal.tenants.models import Membership, Team
    from scheduler.units import mig_units

    rng = random.Random(SEED)
    with transaction.atomic():
        nodes = Node.objects.bulk_create(
            Node(name=f"node-{n:03d}", hostname=f"node-{n:03d}", driver="described")
            for n in range(NODES)
        )
        gpus, slices = [], []
        for node in nodes:
            for index in range(WHOLE_PER_NODE + 2):
                mode = "whole" if index < WHOLE_PER_NODE else ("mig", "mps")[index - WHOLE_PER_NODE]
                gpus.append(
                    Gpu(
                        node=node,
                        uuid=f"GPU-{node.name}-{index}",
                        index=index,
                        model="NVIDIA A100-SXM4-80GB",
                        memory_mb=81920,
                        mode=mode,
                    )
                )
        Gpu.objects.bulk_create(gpus)
        for gpu in gpus:
            if gpu.mode == "whole":
                slices.append(Slice(gpu=gpu, key=gpu.uuid, kind="whole", units=1.0))
            elif gpu.mode == "mig":
                for number, profile in enumerate(["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]):
                    key = f"MIG-{gpu.uuid}-{number}"
                    slices.append(
                        Slice(
                            gpu=gpu,
                            key=key,
                            kind="mig",
                            profile=profile,
                            mig_uuid=key,
                            units=mig_units(profile),
                        )
                    )
            else:
                slices.extend(
                    Slice(gpu=gpu, key=f"{gpu.uuid}/mps/{i}", kind="mps", units=0.25)
                    for i in range(4)
                )
        Slice.objects.bulk_create(slices)

        teams = Team.objects.bulk_create(
            Team(
                name=f"team-{t}",
                weight=1.0 + t % 3,
                guaranteed_units=NODES * WHOLE_PER_NODE / TEAMS / 2,
                limit_units=None,
                max_priority="high",
            )
            for t in range(TEAMS)
        )
        User = get_user_model()
        users = User.objects.bulk_create(
            User(username=f"{team.name}-u{u}", password="!")
            for team in teams
            for u in range(USERS_PER_TEAM)
        )
        Membership.objects.bulk_create(
            Membership(team=teams[i // USERS_PER_TEAM], user=user) for i, user in enumerate(users)
        )

        def job(team_index: int, **fields: Any) -> Job:
            at = now - timedelta(minutes=rng.uniform(1, 600))
            return Job(
                team=teams[team_index],
                user=users[team_index * USERS_PER_TEAM + rng.randrange(USERS_PER_TEAM)],
                name="bench",
                image="python:3.11-slim",
                command=["true"],
                time_limit_s=rng.choice([None, 3600, 4 * 3600, 24 * 3600]),
                submitted_at=at,
                queued_since=at,
                **fields,
            )

        whole = [s for s in slices if s.kind == "whole"]
        held = rng.sample(whole, int(len(whole) * HELD_SHARE))
        running = Job.objects.bulk_create(
            job(
                i % TEAMS,
                state=JobState.RUNNING,
                attempt=1,
                gpu_kind="whole",
                gpu_count=1,
                assigned_at=now - timedelta(minutes=30),
                started_at=now - timedelta(minutes=30),
            )
            for i in range(len(held))
        )
        Allocation.objects.bulk_create(
            Allocation(job=j, attempt=1, slice=s, created_at=now - timedelta(minutes=30))
            for j, s in zip(running, held, strict=True)
        )
        for j, s in zip(running, held, strict=True):
            j.node_id = s.gpu.node_id
        Job.objects.bulk_update(running, ["node"])

        requests = [
            {"gpu_kind": "whole", "gpu_count": 1},
            {"gpu_kind": "whole", "gpu_count": 2},
            {"gpu_kind": "whole", "gpu_count": 4},
            {"gpu_kind": "mig", "gpu_count": 1, "gpu_profile": "1g.10gb"},
            {"gpu_kind": "mig", "gpu_count": 1, "gpu_profile": "3g.40gb"},
            {"gpu_kind": "mps", "gpu_count": 2},
        ]
        Job.objects.bulk_create(
            job(rng.randrange(TEAMS), state=JobState.PENDING, attempt=0, **rng.choice(requests))
            for _ in range(PENDING)
        )
    return {
        "nodes": NODES,
        "slices": len(slices),
        "running": len(running),
        "pending": PENDING,
    }


def _time(now: datetime, repeats: int) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.db import connection

    from portal.jobs.validation import validate_job_request
    from portal.scheduling import whatif

    user = get_user_model().objects.get(username="team-0-u0")
    data = {
        "name": "what-if",
        "team": "team-0",
        "image": "python:3.11-slim",
        "command": ["true"],
        "gpu": {"kind": "whole", "count": 1},
    }
    began = time.perf_counter()
    request = validate_job_request(data, user=user)
    validate_ms = (time.perf_counter() - began) * 1000
    connection.close()  # a fresh connection, as a web request may start with
    fresh, kept, load, decide = [], [], [], []
    answer = None
    for _ in range(repeats):
        whatif.clear_snapshot_cache()
        began = time.perf_counter()
        answer = whatif.what_if(request=request, user=user)
        fresh.append((time.perf_counter() - began) * 1000)
        load.append(answer.load_ms)
        decide.append(answer.decide_ms)
        began = time.perf_counter()
        again = whatif.what_if(request=request, user=user)
        kept.append((time.perf_counter() - began) * 1000)
        assert again.cached
    assert answer is not None
    return {
        "repeats": repeats,
        "validate_ms": round(validate_ms, 1),
        "fresh_median_ms": round(statistics.median(fresh), 1),
        "fresh_max_ms": round(max(fresh), 1),
        "fresh_load_ms": round(statistics.median(load), 1),
        "fresh_decide_ms": round(statistics.median(decide), 1),
        "kept_median_ms": round(statistics.median(kept), 1),
        "kept_max_ms": round(max(kept), 1),
        "answer": {
            "starts_now": answer.starts_now,
            "position": answer.position,
            "reason": answer.reason_code,
            "free": answer.slices.free,
            "exist": answer.slices.exist,
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.whatif", description=__doc__)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    print(json.dumps(run(repeats=args.repeats), indent=2))


if __name__ == "__main__":
    main()
