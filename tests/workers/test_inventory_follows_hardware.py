"""The agent's inventory follows the hardware: read again on SIGHUP, every
PORTAL_AGENT_INVENTORY_S and on a critical Xid error, so a GPU that fell off the bus or a new
MIG layout is seen without a restart, and the attempts on slices that are gone are stopped
and reported lost with the reason.

No GPU here: the NVML fake (tests/fake_nvml.py) changes its MIG layout, loses a GPU
(GPU_IS_LOST) and reports Xid events as the real library does; the agent's real code path
(workers.inventory, workers.hardware, workers.agent) reads it.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_doubles import NODE, TEST_KEY, RecordingSender, ScriptedLauncher, make_launch, sealed
from fake_nvml import FakeGpu, FakeNvml, a100_mig

from workers.agent import Agent, inventory_reader, make_celery_app
from workers.hardware import HardwareWatch, install_sighup, keep_sighup_for
from workers.inventory import XidWatch, discover, nvml_inventory, slices_gone
from workers.protocol import Ack, Device, Finished, Heartbeat, Inventory, LostGpu
from workers.settings import AgentSettings
from workers.signing import key_to_text

CLOCK = 1_700_000_000.0
EVERY_S = 300.0
WHOLE = "GPU-00000000-1111-4000-8000-000000000000"
MIGGED = "GPU-11111111-2222-4000-8000-000000000001"
MIG_A = "MIG-aaaaaaaa-0000-4000-8000-000000000000"
MIG_B = "MIG-bbbbbbbb-0000-4000-8000-000000000000"
MIG_C = "MIG-cccccccc-0000-4000-8000-000000000000"
MIG_D = "MIG-dddddddd-0000-4000-8000-000000000000"
ON_WHOLE = Device(slice_id=WHOLE, kind="whole", gpu_uuid=WHOLE, gpu_index=0)
ON_MIG_A = Device(
    slice_id=MIG_A, kind="mig", gpu_uuid=MIGGED, gpu_index=1, mig_uuid=MIG_A, profile="3g.40gb"
)
ON_MIG_B = Device(
    slice_id=MIG_B, kind="mig", gpu_uuid=MIGGED, gpu_index=1, mig_uuid=MIG_B, profile="3g.40gb"
)


class Clock:
    def __init__(self) -> None:
        self.now = CLOCK

    def __call__(self) -> float:
        return self.now


def a_host() -> FakeNvml:
    """GPU 0 whole; GPU 1 in MIG mode with two 3g.40gb devices."""
    return FakeNvml(
        [
            FakeGpu(uuid=WHOLE, mig_capable=False),
            FakeGpu(
                uuid=MIGGED,
                mig_enabled=True,
                mig_slots=[a100_mig(MIG_A, "3g.40gb", 1), a100_mig(MIG_B, "3g.40gb", 2)],
            ),
        ]
    )


def read_with(nvml: FakeNvml):
    def read(previous: Inventory, unhealthy: dict[str, str]) -> Inventory:
        return discover(NODE, source="nvml", nvml=nvml, previous=previous, unhealthy=unhealthy)

    return read


@pytest.fixture
def nvml() -> FakeNvml:
    return a_host()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def agent(
    nvml: FakeNvml, clock: Clock, sender: RecordingSender, launcher: ScriptedLauncher, tmp_path
) -> Iterator[Agent]:
    inventory = discover(NODE, source="nvml", nvml=nvml)
    watch = HardwareWatch(read_with(nvml), every_s=EVERY_S, xid=XidWatch(nvml), clock=clock)
    assert watch.xid is not None
    watch.xid.register(inventory)
    agent = Agent(
        node=NODE,
        inventory=inventory,
        launcher=launcher,
        send=sender,
        workdir=tmp_path / "agent",
        key=TEST_KEY,
        kill_grace_s=3.0,
        clock=clock,
        boot="boot-1",
        write_lease_file=False,
        hardware=watch,
    )
    heartbeat = agent.heartbeat()
    deliver(agent, Ack(node=NODE, boot="boot-1", heartbeat_seq=heartbeat.seq, lease_s=1000.0))
    yield agent
    for run in launcher.runs:
        if run.code is None:
            run.exit(0)
    assert agent.supervisor.join(5)


@pytest.fixture
def launcher() -> ScriptedLauncher:
    return ScriptedLauncher()


def deliver(agent: Agent, message: object) -> None:
    agent.handle(sealed(message, now=agent._clock()))  # type: ignore[arg-type]


def run_on(agent: Agent, sender: RecordingSender, job_id: int, device: Device) -> None:
    deliver(agent, make_launch(["python", "train.py"], job_id=job_id, devices=(device,)))
    sender.started(job_id)


def last_inventory(sender: RecordingSender) -> Inventory:
    return sender.of_type(Heartbeat)[-1].inventory


# --- reading NVML: lost GPUs, MIG layouts, Xid events -----------------------------------------


def test_a_gpu_that_answers_gpu_is_lost_is_listed_lost_with_its_uuid_from_the_last_inventory(
    nvml: FakeNvml,
) -> None:
    before = nvml_inventory(nvml, hostname=NODE, mps_shares={})
    nvml.lose(1)
    after = nvml_inventory(nvml, hostname=NODE, mps_shares={}, previous=before)
    assert [g.uuid for g in after.gpus] == [WHOLE]
    assert after.lost == (
        LostGpu(
            uuid=MIGGED,
            index=1,
            reason=f"GPU_LOST: NVML answers GPU_IS_LOST for GPU 1 ({MIGGED}): off the bus",
        ),
    )
    assert slices_gone(before, after) == {
        MIG_A: f"GPU_LOST: NVML answers GPU_IS_LOST for GPU 1 ({MIGGED}): off the bus",
        MIG_B: f"GPU_LOST: NVML answers GPU_IS_LOST for GPU 1 ({MIGGED}): off the bus",
    }
    nvml.recover(1)
    back = nvml_inventory(nvml, hostname=NODE, mps_shares={}, previous=after)
    assert back == before


def test_a_gpu_nvml_no_longer_counts_is_lost_as_no_longer_found(nvml: FakeNvml) -> None:
    before = nvml_inventory(nvml, hostname=NODE, mps_shares={})
    del nvml.gpus[1]
    after = nvml_inventory(nvml, hostname=NODE, mps_shares={}, previous=before)
    assert after.lost == (
        LostGpu(
            uuid=MIGGED, index=1, reason=f"GPU_LOST: GPU 1 ({MIGGED}) is no longer found by NVML"
        ),
    )


def test_a_new_mig_layout_gives_the_reason_per_slice_that_went(nvml: FakeNvml) -> None:
    before = nvml_inventory(nvml, hostname=NODE, mps_shares={})
    nvml.reconfigure_mig(
        1,
        [
            a100_mig(MIG_B, "3g.40gb", 2),
            a100_mig(MIG_C, "2g.20gb", 3),
            a100_mig(MIG_D, "1g.10gb", 4),
        ],
    )
    after = nvml_inventory(nvml, hostname=NODE, mps_shares={}, previous=before)
    assert [m.profile for m in after.gpus[1].mig] == ["3g.40gb", "2g.20gb", "1g.10gb"]
    assert slices_gone(before, after) == {
        MIG_A: f"MIG_RECONFIGURED: GPU 1 ({MIGGED}) now has MIG 3g.40gb, 2g.20gb, 1g.10gb"
    }
    nvml.reconfigure_mig(1, [])  # MIG mode off: the GPU is one whole slice
    whole = nvml_inventory(nvml, hostname=NODE, mps_shares={}, previous=after)
    assert sorted(whole.slice_keys()) == [WHOLE, MIGGED]
    assert slices_gone(after, whole) == {
        key: f"MIG_RECONFIGURED: GPU 1 ({MIGGED}) is no longer in MIG mode"
        for key in (MIG_B, MIG_C, MIG_D)
    }


def test_the_fake_refuses_a_mig_change_while_a_mig_device_has_processes_as_nvidia_smi_does(
    nvml: FakeNvml,
) -> None:
    from fake_nvml import NVML_ERROR_IN_USE, FakeProcess, NVMLError

    mig = nvml.gpus[1].mig_slots[0]
    assert mig is not None
    mig.processes.append(FakeProcess(pid=77))
    with pytest.raises(NVMLError) as refused:
        nvml.reconfigure_mig(1, [])
    assert refused.value.value == NVML_ERROR_IN_USE


def test_critical_xid_events_are_read_without_blocking_and_application_xids_are_left_out(
    nvml: FakeNvml,
) -> None:
    watch = XidWatch(nvml)
    watch.register(nvml_inventory(nvml, hostname=NODE, mps_shares={}))
    assert watch.watched == [WHOLE, MIGGED]
    assert watch.poll() == []
    nvml.xid(0, 13)  # an application's own fault: its job fails, the GPU is fine
    nvml.xid(1, 79)  # fallen off the bus
    nvml.xid(0, 48)  # double-bit ECC error
    assert watch.poll() == [(MIGGED, 79), (WHOLE, 48)]
    assert watch.poll() == []
    assert set(nvml.waits) == {0}  # every wait asked for 0 ms: never blocks the heartbeat
    watch.close()
    assert nvml.event_sets == []


# --- the agent: when it reads again -----------------------------------------------------------


def test_sighup_asks_for_a_re_read_that_the_next_beat_does_and_reports_at_once(
    agent: Agent, nvml: FakeNvml, sender: RecordingSender
) -> None:
    assert agent.hardware is not None
    previous = signal.getsignal(signal.SIGHUP)
    install_sighup(agent.hardware)
    try:
        nvml.reconfigure_mig(1, [a100_mig(MIG_C, "7g.80gb", 0)])
        agent.beat()
        assert [m.uuid for m in last_inventory(sender).gpus[1].mig] == [MIG_A, MIG_B]
        os.kill(os.getpid(), signal.SIGHUP)
        assert agent.hardware.due() == "SIGHUP"
        assert agent.hardware.wake.is_set()  # the heartbeat thread does not wait its period
        agent.beat()
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert [(m.uuid, m.profile) for m in last_inventory(sender).gpus[1].mig] == [(MIG_C, "7g.80gb")]
    assert agent.hardware.due() is None


def test_the_inventory_is_read_again_every_inventory_s(
    agent: Agent, nvml: FakeNvml, clock: Clock, sender: RecordingSender
) -> None:
    nvml.reconfigure_mig(1, [a100_mig(MIG_C, "7g.80gb", 0)])
    clock.now = CLOCK + EVERY_S - 1
    agent.beat()
    assert [m.uuid for m in last_inventory(sender).gpus[1].mig] == [MIG_A, MIG_B]
    clock.now = CLOCK + EVERY_S
    agent.beat()
    assert [m.uuid for m in last_inventory(sender).gpus[1].mig] == [MIG_C]
    clock.now = CLOCK + EVERY_S + 1
    assert agent.hardware is not None and agent.hardware.due() is None


@pytest.mark.filterwarnings("ignore::celery.exceptions.SecurityWarning")
def test_celerys_sighup_handler_which_would_re_exec_the_agent_is_replaced_by_the_re_read(
    agent: Agent,
) -> None:
    assert agent.hardware is not None
    worker = make_celery_app("memory://", NODE).Worker(
        queues=[f"node.{NODE}"], pool="solo", without_gossip=True, without_mingle=True
    )
    worker._isatty = False  # an agent under systemd or compose: Celery installs its SIGHUP
    saved = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    saved[signal.SIGQUIT] = signal.getsignal(signal.SIGQUIT)
    saved[signal.SIGUSR1] = signal.getsignal(signal.SIGUSR1)
    try:
        worker.install_platform_tweaks(worker)
        assert signal.getsignal(signal.SIGHUP) != agent.hardware.on_sighup  # Celery's re-exec
        keep_sighup_for(worker, agent.hardware)
        worker.install_platform_tweaks(worker)
        assert signal.getsignal(signal.SIGHUP) == agent.hardware.on_sighup
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


def test_the_reader_uses_the_source_the_agent_started_with_and_reads_a_description_file_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({"gpus": [{"mode": "whole", "count": 2}]}))
    settings = AgentSettings.from_env(
        {
            "PORTAL_AGENT_NODE": NODE,
            "PORTAL_AGENT_KEY": key_to_text(TEST_KEY),
            "PORTAL_AGENT_INVENTORY": str(path),
            "PORTAL_AGENT_INVENTORY_S": "120",
        }
    )
    assert settings.inventory_s == 120.0
    first = discover(NODE, source="described", description=str(path))
    path.write_text(json.dumps({"gpus": [{"mode": "whole"}, {"mode": "mps", "mps_shares": 2}]}))
    again = inventory_reader(settings, "described", None)(first, {})
    assert [(g.index, g.mode, g.mps_shares) for g in again.gpus] == [(0, "whole", 0), (1, "mps", 2)]
    assert slices_gone(first, again) == {
        first.gpus[1].uuid: f"GPU_RECONFIGURED: GPU 1 ({first.gpus[1].uuid}) is now in mps mode "
        "with 2 shares"
    }


def test_a_re_read_that_fails_keeps_the_last_inventory(
    agent: Agent, nvml: FakeNvml, sender: RecordingSender, caplog: pytest.LogCaptureFixture
) -> None:
    before = agent.inventory
    nvml.driver_loaded = False  # the driver went away: NVML init fails
    assert agent.refresh_inventory("test") == {}
    assert agent.inventory is before
    assert "inventory not read again (the last one stays): PORTAL_AGENT_GPU_SOURCE=nvml but" in (
        caplog.text
    )


# --- the agent: what it does with a change ----------------------------------------------------


def test_a_lost_gpu_stops_its_attempts_as_lost_with_the_reason_and_leaves_the_others_running(
    agent: Agent, nvml: FakeNvml, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    run_on(agent, sender, 1, ON_WHOLE)
    run_on(agent, sender, 2, ON_MIG_A)
    nvml.lose(1)
    assert agent.hardware is not None
    agent.hardware.request("test")
    agent.beat()
    finished = sender.finished(2)
    assert (finished.outcome, finished.error, finished.exit_code) == (
        "lost",
        f"GPU_LOST: NVML answers GPU_IS_LOST for GPU 1 ({MIGGED}): off the bus",
        143,
    )
    assert launcher.runs[1].terminated_with == [3.0]
    assert launcher.runs[0].terminated_with == []
    inventory = last_inventory(sender)
    assert [g.uuid for g in inventory.gpus] == [WHOLE]
    assert [(g.uuid, g.index) for g in inventory.lost] == [(MIGGED, 1)]
    assert [r.job_id for r in agent.supervisor.running()] == [1]


def test_a_mig_reconfiguration_stops_only_the_attempts_on_mig_devices_that_went(
    agent: Agent, nvml: FakeNvml, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    run_on(agent, sender, 1, ON_MIG_A)
    run_on(agent, sender, 2, ON_MIG_B)
    nvml.reconfigure_mig(1, [a100_mig(MIG_B, "3g.40gb", 2), a100_mig(MIG_C, "3g.40gb", 1)])
    gone = agent.refresh_inventory("SIGHUP")
    reason = f"MIG_RECONFIGURED: GPU 1 ({MIGGED}) now has MIG 3g.40gb, 3g.40gb"
    assert gone == {MIG_A: reason}
    finished = sender.finished(1)
    assert (finished.outcome, finished.error) == ("lost", reason)
    assert [r.job_id for r in agent.supervisor.running()] == [2]


def test_an_xid_error_takes_the_gpu_out_until_sighup_forgets_it(
    agent: Agent, nvml: FakeNvml, sender: RecordingSender
) -> None:
    run_on(agent, sender, 1, ON_WHOLE)
    nvml.xid(0, 48)
    agent.beat()  # polls the event set, and reads the inventory at once
    why = (
        f"GPU_LOST: NVML reported critical Xid 48 on {WHOLE}; taken out until the agent's "
        "next SIGHUP or restart (reset the GPU first)"
    )
    finished = sender.finished(1)
    assert (finished.outcome, finished.error) == ("lost", why)
    assert last_inventory(sender).lost == (LostGpu(uuid=WHOLE, index=0, reason=why),)
    assert agent.hardware is not None
    agent.hardware.request("every 300 s")  # a periodic read keeps it out
    agent.beat()
    assert [g.uuid for g in last_inventory(sender).lost] == [WHOLE]
    agent.hardware.on_sighup(signal.SIGHUP, None)
    agent.beat()
    assert [g.uuid for g in last_inventory(sender).gpus] == [WHOLE, MIGGED]
    assert last_inventory(sender).lost == ()


def test_a_launch_onto_a_slice_that_went_is_not_started_and_reported_lost(
    agent: Agent, nvml: FakeNvml, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    nvml.lose(0)
    agent.refresh_inventory("test")
    deliver(agent, make_launch(["python", "train.py"], job_id=5, devices=(ON_WHOLE,)))
    finished = sender.finished(5)
    assert (finished.outcome, finished.error) == (
        "lost",
        f"GPU_LOST: NVML answers GPU_IS_LOST for GPU 0 ({WHOLE}): off the bus",
    )
    assert launcher.runs == []


def test_a_job_that_fails_because_its_gpu_fell_off_is_reported_lost_not_failed(
    agent: Agent, nvml: FakeNvml, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    run_on(agent, sender, 1, ON_WHOLE)
    nvml.lose(0)
    launcher.runs[0].exit(1)  # CUDA error before the next re-read
    finished = sender.finished(1)
    assert (finished.outcome, finished.exit_code, finished.error) == (
        "lost",
        1,
        f"GPU_LOST: NVML answers GPU_IS_LOST for GPU 0 ({WHOLE}): off the bus",
    )


def test_a_job_that_succeeded_before_the_re_read_keeps_its_result(
    agent: Agent, nvml: FakeNvml, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    run_on(agent, sender, 1, ON_WHOLE)
    launcher.runs[0].exit(0)
    assert sender.finished(1).outcome == "succeeded"
    nvml.lose(0)
    agent.refresh_inventory("test")
    assert [m.outcome for m in sender.of_type(Finished)] == ["succeeded"]


def test_a_failed_gpu_sample_asks_for_a_re_read(
    agent: Agent, nvml: FakeNvml, clock: Clock, sender: RecordingSender
) -> None:
    from workers.metrics import NvmlSampler

    agent._sampler = NvmlSampler(nvml)
    agent.beat()
    assert agent.hardware is not None and agent.hardware.due() is None
    nvml.lose(0)
    clock.now += agent.metrics_s
    agent.beat()  # the sample answers GPU_IS_LOST: a re-read is due
    assert agent.hardware.due() == f"samples of {WHOLE} failed"
    agent.beat()
    assert [g.uuid for g in last_inventory(sender).lost] == [WHOLE]
