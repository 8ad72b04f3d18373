"""A two-node gang through every real process: two agents (one whole GPU each, described),
one job that needs both GPUs, each node's part printing its rendezvous environment and then
meeting the other part at MASTER_ADDR:MASTER_PORT over TCP.

Both parts must get the same MASTER_ADDR / MASTER_PORT / WORLD_SIZE and their own ranks, the
job must be RUNNING only once both started, and it succeeds once both finished. The test
prints how long the gang took from its assignment to all ranks running (the job's RUNNING
event), the figure docs/agent.md quotes.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from django.core.management import call_command
from gang_job import RENDEZVOUS, gang_env
from portal_client import PortalClient
from stack import AgentHost, PortalStack

from portal.jobs.gangs import master_port
from portal.jobs.models import GangPart, Job, JobEvent, JobLogChunk
from portal.tenants.tokens import token_issue

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ONE_WHOLE_GPU = json.dumps({"gpus": [{"mode": "whole", "count": 1}]})
JOB_TIMEOUT_S = 90.0


def _alice_token() -> str:
    from django.contrib.auth import get_user_model

    return token_issue(user=get_user_model().objects.get(username="alice"))


def test_a_two_node_gang_gets_its_rendezvous_on_both_agents_and_both_parts_finish(
    tmp_path: Path,
) -> None:
    call_command("seed_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    agent_env = {
        "PORTAL_AGENT_INVENTORY": ONE_WHOLE_GPU,
        "PORTAL_AGENT_GPU_SOURCE": "described",
        # The parts must reach each other: here both hosts are this one.
        "PORTAL_AGENT_JOB_NETWORK": "host",
    }
    suffix = uuid.uuid4().hex[:8]
    hosts = [AgentHost(node=f"gang-{side}-{suffix}") for side in ("a", "b")]
    with PortalStack(tmp_path, web=True, agents=hosts, agent_env=agent_env) as stack:
        assert stack.url is not None
        api = PortalClient(stack.url, _alice_token())
        job = api.submit(
            name="gang-of-two",
            team="vision",
            image="python:3.11-slim",
            command=["python3", "-c", RENDEZVOUS],
            gpu={"kind": "whole", "count": 2, "multi_node": True},
        )

        def ended() -> Job | None:
            row = Job.objects.get(pk=job["id"])
            return row if row.is_terminal else None

        done = stack.wait_for(ended, JOB_TIMEOUT_S, f"job {job['id']} ended")
        assert (done.state, done.exit_code) == ("SUCCEEDED", 0), api.log(job["id"])

        parts = list(GangPart.objects.filter(job_id=done.pk, attempt=done.attempt))
        other = next(node for node in stack.nodes if node != done.node.name)
        assert sorted((p.rank, p.node.name, p.outcome) for p in parts) == [
            (0, done.node.name, "succeeded"),
            (1, other, "succeeded"),
        ]
        logs = {
            part: "".join(
                JobLogChunk.objects.filter(job_id=done.pk, attempt=done.attempt, part=part)
                .order_by("seq")
                .values_list("data", flat=True)
            )
            for part in (0, 1)
        }
        assert gang_env(api.log(done.pk)) == gang_env(logs[0])  # the log people see is rank 0's
        shared = {
            "MASTER_ADDR": "127.0.0.1",  # the agents' default: the route to the broker
            "MASTER_PORT": str(master_port(done.pk)),
            "WORLD_SIZE": "2",
            "NNODES": "2",
            "LOCAL_WORLD_SIZE": "1",
            "PORTAL_GANG_HOSTS": "127.0.0.1,127.0.0.1",
            "PORTAL_GANG_SLOTS": "127.0.0.1:1,127.0.0.1:1",
        }
        for rank in (0, 1):
            assert gang_env(logs[rank]) == {
                **shared,
                "RANK": str(rank),
                "NODE_RANK": str(rank),
                "GROUP_RANK": str(rank),
            }, logs[rank]
        assert "rank 0 met: rank 1 of 2" in logs[0], logs[0]
        assert "node rank 1 heard: welcome" in logs[1], logs[1]

        running = JobEvent.objects.get(job_id=done.pk, from_state="ASSIGNED", to_state="RUNNING")
        assert running.message == "started on all 2 nodes"
        assert done.started_at == max(p.started_at for p in parts)
        assigned_at = JobEvent.objects.get(
            job_id=done.pk, from_state="PENDING", to_state="ASSIGNED"
        ).at
        print(
            f"\ngang start to all ranks running: {(running.at - assigned_at).total_seconds():.3f} s "
            f"(assignment to RUNNING recorded); last rank's own start "
            f"{(done.started_at - assigned_at).total_seconds():.3f} s after assignment"
        )
