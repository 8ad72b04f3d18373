"""CPU of admissions in one process: what `bench.api --admissions-only`'s admissions/s are
made of, robust to a busy machine.

On a scratch database next to DATABASE_URL (dropped afterwards) it builds the world of
``bench/api.py`` (``--nodes`` nodes of 8 GPUs), submits one job per GPU, then, with the
broker left out (what the portal sends is recorded instead), runs one scheduling pass with
its dispatch (the launches built and signed, one message per node), answers each node's
launches with one signed ``reports`` batch of ``started`` as the fake agents do, and hands
each batch to the report task itself, as the control worker would. It prints the CPU time
of this process (``time.process_time``: the database server's is not in it) and the wall
time of the two phases; ``--profile`` prints cProfile's top functions of each.

``python -m bench.admissions_cpu [--nodes 250] [--profile]``
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
import time
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
    from django.core.management import call_command

    from bench.api import GPUS_PER_NODE, _build_world
    from bench.db_pass import scratch_database
    from bench.fake_agents import answer_launches
    from portal.agents.tasks import agent_report
    from portal.agents.testing import capture_sent_messages
    from portal.jobs.services import jobs_submit
    from portal.scheduling.service import run_schedule_pass
    from workers.protocol import TASK_LAUNCH, report_batches
    from workers.signing import open_envelope, seal

    results: dict[str, Any] = {"nodes": nodes, "jobs": nodes * GPUS_PER_NODE}
    with scratch_database(SCRATCH_SUFFIX):
        call_command("migrate", verbosity=0, interactive=False)
        with capture_sent_messages():
            world = _build_world(nodes=nodes, users=1, history=0)
        keys: dict[str, bytes] = world["keys"]
        with capture_sent_messages() as sent:
            jobs_submit(
                user=world["people"][0], request=world["request"], members=[None] * results["jobs"]
            )
            results["pass_and_dispatch"] = _timed(
                f"pass + dispatch of {results['jobs']} jobs", run_schedule_pass, profile=profile
            )
        # What the fake agents answer (bench/fake_agents.py): one batch of `started` a node.
        envelopes = []
        for body in (message for name, message, _ in sent.sent if name == TASK_LAUNCH):
            envelope = open_envelope(body)
            _, started = answer_launches(envelope, keys[envelope.node])
            envelopes += [
                seal(batch, node=envelope.node, key=keys[envelope.node], now=time.time())
                for batch in report_batches(envelope.node, started)
            ]
        results["report_batches"] = len(envelopes)

        def handle_reports() -> None:
            with capture_sent_messages():  # the acknowledgements
                for envelope in envelopes:
                    agent_report(envelope)

        results["reports"] = _timed(
            f"{len(envelopes)} report batches of 'started'", handle_reports, profile=profile
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
