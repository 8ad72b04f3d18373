"""Speed of the submit form's what-if (``portal.scheduling.whatif.what_if``) on a mid-size
cluster: the core benchmark's scenario (``bench/core_pass.py``) at 100 nodes x 8 GPUs (whole,
MIG and MPS) with about nine in ten slices held and 1,000 pending jobs of 20 teams, written
by ``bench/db_pass.py``'s loader.

Written to a scratch database like ``bench/db_pass.py`` (PostgreSQL next to DATABASE_URL's,
or a temporary SQLite file) and dropped afterwards. Timed, each ``--repeats`` times:

- ``fresh``: the snapshot loaded for the question (``now=`` given, as when the kept snapshot
  is stale), then ``schedule()`` with the candidate;
- ``kept``: the snapshot kept from the question before (the form's next question within
  ``SNAPSHOT_TTL_S`` while no pass ran): ``schedule()`` and the answer only.

The request: one whole GPU for ``team00``. ``python -m bench.whatif [--repeats N]`` prints
the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

NODES = 100
PENDING = 1_000
TEAM, USER = "team00", "team00-u0"


def run(repeats: int = 10) -> dict[str, Any]:
    import django

    django.setup()
    from django.core.management import call_command

    from bench.core_pass import build_snapshot
    from bench.db_pass import _populate, scratch_database

    with scratch_database() as vendor:
        call_command("migrate", verbosity=0, interactive=False)
        now = datetime.now(tz=UTC).replace(microsecond=0)
        sizes = _populate(now, build_snapshot(nodes=NODES, pending=PENDING))
        figures = _time(now, repeats)
    return {"database": vendor, **sizes, **figures}


def _time(now: datetime, repeats: int) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.db import connection

    from portal.jobs.validation import validate_job_request
    from portal.scheduling import whatif

    user = get_user_model().objects.get(username=USER)
    data = {
        "name": "what-if",
        "team": TEAM,
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
