"""A GPU falls off the bus under a running job; the operator's SIGHUP (or the periodic re-read)
makes the agent see it, and the job is back in PENDING with the reason, the slice drained and
the change on the node; the GPU comes back and is placeable again.

End to end in one process: the real agent (workers.agent.Agent with its heartbeat thread and
workers.hardware) on the NVML fake (no GPU here), a real `sleep` process as the job, and the
agent's heartbeats and reports through the portal's own report handling. Measured: from the
SIGHUP to the job back in PENDING.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml
from sleeping_job import SleepingLauncher

from portal.agents.dispatch import send_launch
from portal.agents.keys import node_key_text
from portal.agents.testing import capture_sent_messages, deliver
from portal.cluster.models import NodeEvent, Slice
from portal.jobs.models import Allocation, Job, JobState
from portal.jobs.testing import allocate, make_job, make_team, make_user
from workers.agent import Agent
from workers.hardware import HardwareWatch, install_sighup
from workers.inventory import XidWatch, discover
from workers.protocol import Ack, Inventory, Message, Metrics, parse
from workers.signing import key_from_text, seal

pytestmark = pytest.mark.django_db(transaction=True)

NODE = "node-1"
GPU_A = "GPU-aaaaaaaa-1111-4000-8000-000000000000"
GPU_B = "GPU-bbbbbbbb-2222-4000-8000-000000000001"
HEARTBEAT_S = 0.5
OFF_THE_BUS = f"GPU_LOST: NVML answers GPU_IS_LOST for GPU 1 ({GPU_B}): off the bus"


def test_a_gpu_lost_under_a_job_requeues_it_and_comes_back_placeable(
    tmp_path: Path, settings: object, record_property: object
) -> None:
    settings.JOB_MAX_RETRIES = 2  # type: ignore[attr-defined]
    nvml = FakeNvml(
        [FakeGpu(uuid=GPU_A, mig_capable=False), FakeGpu(uuid=GPU_B, mig_capable=False)]
    )
    key = key_from_text(node_key_text(name=NODE))

    def read(previous: Inventory, unhealthy: dict[str, str]) -> Inventory:
        return discover(NODE, source="nvml", nvml=nvml, previous=previous, unhealthy=unhealthy)

    inventory = discover(NODE, source="nvml", nvml=nvml)
    watch = HardwareWatch(read, every_s=300.0, xid=XidWatch(nvml), clock=time.time)
    outbox: list[Message] = []
    agent = Agent(
        node=NODE,
        inventory=inventory,
        launcher=SleepingLauncher(),
        send=outbox.append,
        workdir=tmp_path / "agent",
        key=key,
        boot="boot-1",
        write_lease_file=False,
        hardware=watch,
    )
    beat = agent.heartbeat()
    assert deliver(beat.to_dict()) == "heartbeat"  # registers the node and its two GPUs
    agent.handle(
        seal(
            Ack(node=NODE, boot="boot-1", heartbeat_seq=beat.seq, lease_s=3600.0),
            node=NODE,
            key=key,
            now=time.time(),
        )
    )
    team = make_team("vision", limit_units=None)
    job = make_job(team=team, user=make_user("alice", team=team), state=JobState.ASSIGNED)
    allocate(job, [GPU_B])
    with capture_sent_messages() as sent:
        send_launch(job.pk)
    ((launch, _),) = sent.launches()

    previous = signal.getsignal(signal.SIGHUP)
    install_sighup(watch)
    agent.start(HEARTBEAT_S)
    try:
        agent.handle(seal(parse(launch), node=NODE, key=key, now=time.time()))
        _pump_until(outbox, lambda: _state(job) == JobState.RUNNING)
        nvml.lose(1)
        asked_at = time.monotonic()
        os.kill(os.getpid(), signal.SIGHUP)  # the operator: `kill -HUP <agent>`
        _pump_until(outbox, lambda: _state(job) == JobState.PENDING)
        took = time.monotonic() - asked_at
        assert not Slice.objects.get(key=GPU_B).present

        nvml.recover(1)
        os.kill(os.getpid(), signal.SIGHUP)
        _pump_until(outbox, lambda: Slice.objects.get(key=GPU_B).present)
    finally:
        signal.signal(signal.SIGHUP, previous)
        agent.close(grace_s=1.0)

    record_property("gpu_lost_sighup_to_requeue_s", round(took, 2))
    print(f"GPU lost, SIGHUP -> job requeued: {took:.2f} s (heartbeat every {HEARTBEAT_S:g} s)")
    assert took < 5.0  # the woken heartbeat, the stop, the report

    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.PENDING, 1)
    lost, requeued = job.events.order_by("at", "id")[job.events.count() - 2 :]
    assert (lost.from_state, lost.to_state, lost.message) == (
        "RUNNING",
        "LOST",
        f"lost: lost on {NODE}: {OFF_THE_BUS}",
    )
    assert requeued.message == "requeued after loss 1 of 3 allowed"
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    kinds = list(NodeEvent.objects.filter(node__name=NODE).values_list("kind", "message"))
    assert kinds[0][0] == "gpu_lost" and kinds[0][1].startswith(
        f"{OFF_THE_BUS}; slices drained: {GPU_B}"
    )
    assert kinds[-1] == (
        "gpu_back",
        f"GPU 1 ({GPU_B}) is in the inventory again: 1 slice(s) placeable ({GPU_B})",
    )


def _state(job: Job) -> str:
    return str(Job.objects.values_list("state", flat=True).get(pk=job.pk))


def _pump_until(outbox: list[Message], done: object, timeout: float = 30.0) -> None:
    """Deliver the agent's heartbeats and reports to the portal until `done()`."""
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        while outbox:
            message = outbox.pop(0)
            if not isinstance(message, Metrics):
                deliver(message.to_dict())
        assert time.monotonic() < deadline, "the portal never got there"
        time.sleep(0.02)
