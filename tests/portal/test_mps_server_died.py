"""An MPS daemon that dies takes its GPU's jobs with it; the portal requeues them.

End to end in one process: the portal registers the node and sends the launch, the real
agent (workers.agent.Agent, with its `mps` thread) runs it on the MPS share of a daemon
started from the FAKE nvidia-cuda-mps-control (tests/bin; no GPU here), the daemon is killed,
and the agent's reports go through the portal's own report handling. Measured: from the kill
to the job back in PENDING.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mps_fake import FAKE_MPS_CONTROL, kill_daemon, mps_root
from sleeping_job import SleepingLauncher

from portal.agents.dispatch import send_launch
from portal.agents.keys import node_key_text
from portal.agents.testing import capture_sent_messages, deliver, finished, register_node
from portal.cluster.models import Slice
from portal.jobs.models import Allocation, Job, JobState
from portal.jobs.testing import allocate, make_job, make_team, make_user
from workers.agent import Agent
from workers.inventory import DEFAULT_DESCRIPTION, described_inventory
from workers.mps import MpsSupervisor
from workers.protocol import Ack, Heartbeat, Message, Metrics, parse
from workers.signing import key_from_text, seal

pytestmark = pytest.mark.django_db

NODE = "node-1"
HEARTBEAT_S = 2.0  # the agent's default (PORTAL_AGENT_HEARTBEAT_S): MPS checks run as often


def _mps_job(team_name: str = "vision") -> Job:
    team = make_team(team_name, limit_units=None)
    job = make_job(
        team=team, user=make_user("alice", team=team), state=JobState.ASSIGNED, gpu_kind="mps"
    )
    share = Slice.objects.filter(kind="mps", gpu__node__name=NODE).order_by("key").first()
    assert share is not None
    allocate(job, [share.key])
    return job


def test_a_dead_mps_daemon_sends_its_gpus_job_back_to_pending_saying_why(
    tmp_path: Path, settings: object, record_property: object
) -> None:
    settings.JOB_MAX_RETRIES = 2  # type: ignore[attr-defined]
    register_node(NODE)
    job = _mps_job()
    with capture_sent_messages() as sent:
        send_launch(job.pk)
    ((launch, _),) = sent.launches()

    outbox: list[Message] = []
    key = key_from_text(node_key_text(name=NODE))
    with mps_root() as root:
        mps = MpsSupervisor(
            described_inventory(NODE, DEFAULT_DESCRIPTION),
            root,
            binary=FAKE_MPS_CONTROL,
            check_every_s=HEARTBEAT_S,
            kill_grace_s=5.0,
        )
        mps.prepare()
        agent = Agent(
            node=NODE,
            inventory=described_inventory(NODE, DEFAULT_DESCRIPTION),
            launcher=SleepingLauncher(),
            send=outbox.append,
            workdir=tmp_path / "agent",
            key=key,
            boot="boot-1",
            write_lease_file=False,
            mps=mps,
        )
        beat = agent.heartbeat()
        ack = Ack(node=NODE, boot=agent.boot, heartbeat_seq=beat.seq, lease_s=3600.0)
        agent.handle(seal(ack, node=NODE, key=key, now=time.time()))
        agent.start(HEARTBEAT_S)
        try:
            agent.handle(seal(parse(launch), node=NODE, key=key, now=time.time()))
            _pump_until(outbox, lambda: _state(job) == JobState.RUNNING)

            (gpu,) = [d.gpu_uuid for d in parse(launch).devices]  # type: ignore[union-attr]
            killed_at = time.monotonic()
            dead = kill_daemon(root / gpu / "pipe")
            _pump_until(outbox, lambda: _state(job) == JobState.PENDING)
            took = time.monotonic() - killed_at
        finally:
            agent.close(grace_s=1.0)
            mps.stop()

    record_property("mps_crash_to_requeue_s", round(took, 2))
    print(f"MPS daemon crash -> job requeued: {took:.2f} s (checks every {HEARTBEAT_S:g} s)")
    assert took < HEARTBEAT_S + 5.0  # a check period, the check, the stop, the report

    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.PENDING, 1)
    lost, requeued = job.events.order_by("at", "id")[job.events.count() - 2 :]
    assert (lost.from_state, lost.to_state) == ("RUNNING", "LOST")
    assert lost.message == (
        f"lost: lost on {NODE}: MPS_SERVER_DIED: the MPS control daemon of {gpu} died (its "
        f"process {dead} is gone)"
    )
    assert (requeued.to_state, requeued.message) == (
        "PENDING",
        "requeued after loss 1 of 3 allowed",
    )
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_past_the_retry_bound_a_job_lost_to_its_mps_daemon_fails_saying_why(settings) -> None:
    settings.JOB_MAX_RETRIES = 0
    register_node(NODE)
    job = _mps_job()
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    why = "MPS_SERVER_DIED: the MPS control daemon of GPU-x died (its control pipe is gone)"

    deliver(finished(job.pk, 1, outcome="lost", exit_code=143, error=why))

    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.reason == f"lost 1 times (PORTAL_JOB_MAX_RETRIES=0); last: lost on {NODE}: {why}"


# --- helpers ---------------------------------------------------------------------------------


def _state(job: Job) -> str:
    return str(Job.objects.values_list("state", flat=True).get(pk=job.pk))


def _pump_until(outbox: list[Message], done: object, timeout: float = 30.0) -> None:
    """Deliver the agent's reports to the portal (on this thread: the test database's) until
    `done()`; heartbeats and metrics stay out (this test is about the reports)."""
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        while outbox:
            message = outbox.pop(0)
            if not isinstance(message, (Heartbeat, Metrics)):
                deliver(message.to_dict())
        assert time.monotonic() < deadline, "the portal never got there"
        time.sleep(0.02)
