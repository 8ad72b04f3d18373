"""CPU of admissions in one process: what `bench.api --admissions-only`'s admissions/s are
made of, robust to a busy machine.

On a scratch database next to DATABASE_URL (dropped afterwards) it builds the world of
``bench/api.py`` (``--nodes`` nodes of 8 GPUs), submits one job per GPU, then runs one
scheduling pass with its dispatch (the launches built, signed and published to each node's
queue on the broker at REDIS_URL, one message per node), reads the launches back from the
node queues, answers each node's launches with one signed ``reports`` batch of ``started``
as the fake agents do, and runs each batch through the report task's Celery tracer, as the
control worker does (its signals, its request context, its database connection checks),
its acknowledgement published for real. The node queues are emptied before and after (the
bench's nodes are its own: ``bench-NNNN``). It prints the CPU time of this process
(``time.process_time``: the database server's and Redis's are not in it) and the wall time
of the two phases; ``--profile`` prints cProfile's top functions of each.

``python -m bench.admissions_cpu [--nodes 250] [--profile]``
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.api_cpu import print_profile

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

ROOT = Path(__file__).resolve().parent.parent
SCRATCH_SUFFIX = "_admissions_cpu_bench"


def _timed(label: str, work: Callable[[], Any], *, profile: bool) -> dict[str, float]:
    profiler = cProfile.Profile(time.process_time) if profile else None
    cpu_began, wall_began = time.process_time(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    work()
    if profiler is not None:
        profiler.disable()
    figures = {
        "cpu_s": round(time.process_time() - cpu_began, 3),
        "wall_s": round(time.perf_counter() - wall_began, 3),
    }
    print(
        f"{label:34s} {figures['cpu_s']:6.2f} s CPU, {figures['wall_s']:6.2f} s wall"
        f"{' (under cProfile)' if profile else ''}",
        flush=True,
    )
    if profiler is not None:
        print_profile(profiler)
    return figures


def run(*, nodes: int = 250, profile: bool = False) -> dict[str, Any]:
    import django

    django.setup()
    from celery.app.trace import trace_task
    from django.core.management import call_command

    from bench.api import GPUS_PER_NODE, _build_world
    from bench.db_pass import scratch_database
    from bench.fake_agents import answer_launches
    from portal.agents.tasks import agent_report
    from portal.agents.testing import capture_sent_messages
    from portal.celery import app
    from portal.jobs.services import jobs_submit
    from portal.scheduling.service import run_schedule_pass
    from workers.protocol import TASK_AGENT_REPORT, TASK_LAUNCH, node_queue, report_batches
    from workers.signing import open_envelope, seal

    results: dict[str, Any] = {"nodes": nodes, "jobs": nodes * GPUS_PER_NODE}
    with scratch_database(SCRATCH_SUFFIX):
        call_command("migrate", verbosity=0, interactive=False)
        with capture_sent_messages():
            world = _build_world(nodes=nodes, users=1, history=0)
        keys: dict[str, bytes] = world["keys"]
        queues = [node_queue(node) for node in sorted(keys)]
        with app.connection_for_write() as broker:
            redis = broker.default_channel.client
            redis.delete(*queues)
            with capture_sent_messages():  # its request for a pass: the pass is run here
                jobs_submit(
                    user=world["people"][0],
                    request=world["request"],
                    members=[None] * results["jobs"],
                )
            results["pass_and_dispatch"] = _timed(
                f"pass + dispatch of {results['jobs']} jobs", run_schedule_pass, profile=profile
            )
            # What the fake agents answer (bench/fake_agents.py): one batch of `started` a node,
            # for the launches on its queue.
            launches = [json.loads(raw) for queue in queues for raw in redis.lrange(queue, 0, -1)]
            redis.delete(*queues)
            envelopes = []
            for message in launches:
                if message["headers"]["task"] != TASK_LAUNCH:
                    continue
                (body,), _, _ = json.loads(base64.b64decode(message["body"]))
                envelope = open_envelope(body)
                _, started = answer_launches(envelope, keys[envelope.node])
                envelopes += [
                    seal(batch, node=envelope.node, key=keys[envelope.node], now=time.time())
                    for batch in report_batches(envelope.node, started)
                ]
            results["report_batches"] = len(envelopes)

            def handle_reports() -> None:
                # As the control worker runs a task it took off its queue: the task's tracer
                # (built once, kept on the task), a request context as a message gives it.
                for envelope in envelopes:
                    task_id = str(uuid.uuid4())
                    request = {
                        "id": task_id,
                        "task": TASK_AGENT_REPORT,
                        "delivery_info": {"exchange": "", "routing_key": "control"},
                        "hostname": "bench@admissions",
                        "is_eager": False,
                    }
                    trace_task(agent_report, task_id, (envelope,), {}, request, app=app)

            results["reports"] = _timed(
                f"{len(envelopes)} report batches of 'started'", handle_reports, profile=profile
            )
            results["acks_published"] = sum(redis.llen(queue) for queue in queues)
            redis.delete(*queues)
        if results["acks_published"] != results["report_batches"]:
            raise SystemExit(
                f"bench.admissions_cpu: {results['acks_published']} acknowledgements published "
                f"for {results['report_batches']} report batches"
            )
        from portal.jobs.models import Job, JobState

        running = Job.objects.filter(state=JobState.RUNNING).count()
        if running != results["jobs"]:
            raise SystemExit(f"bench.admissions_cpu: {running} of {results['jobs']} RUNNING")
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.admissions_cpu", description=__doc__)
    parser.add_argument("--nodes", type=int, default=250, help="nodes of 8 GPUs")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    args = parser.parse_args(argv)
    run(nodes=args.nodes, profile=args.profile)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
