"""The agent's launch/stop handlers: idempotency by (job_id, attempt), heartbeats, metrics.

No broker: the agent sends through a RecordingSender and launches ScriptedRuns.
"""

from __future__ import annotations

import logging

import pytest
from agent_doubles import (
    GPU_0,
    MIG_1,
    MIG_SLICE,
    MPS_SHARE,
    RecordingSender,
    ScriptedLauncher,
    make_launch,
)
from fake_nvml import FakeGpu, FakeMig, FakeNvml

from workers.agent import Agent
from workers.inventory import discover
from workers.launch import LaunchError
from workers.metrics import NvmlSampler
from workers.protocol import Finished, Heartbeat, JobRef, Metrics, Started, Stop

CLOCK = 1_700_000_000.0


def make_agent(
    sender: RecordingSender, launcher: ScriptedLauncher, sampler: NvmlSampler | None = None
) -> Agent:
    return Agent(
        node="node-h",
        inventory=discover("node-h", source="described"),
        launcher=launcher,
        send=sender,
        kill_grace_s=3.0,
        sampler=sampler,
        clock=lambda: CLOCK,
    )


@pytest.fixture
def launcher() -> ScriptedLauncher:
    return ScriptedLauncher(output=[b"hello\n"])


@pytest.fixture
def agent(sender: RecordingSender, launcher: ScriptedLauncher) -> Agent:
    agent = make_agent(sender, launcher)
    yield agent
    for run in launcher.runs:
        if run.code is None:
            run.exit(0)
    assert agent.supervisor.join(5)


LAUNCH = make_launch(["python", "train.py"]).to_dict()
STOP = Stop(job_id=1, attempt=0, reason="cancel", grace_s=4.0).to_dict()


def test_a_launch_starts_the_attempt_and_reports_started_then_finished(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    agent.handle_launch(LAUNCH)
    started = sender.started()
    assert started == Started(node="node-h", job_id=1, attempt=0, started_at=CLOCK, pid=1000)
    launcher.runs[0].exit(0)
    assert sender.finished() == Finished(
        node="node-h",
        job_id=1,
        attempt=0,
        exit_code=0,
        outcome="succeeded",
        finished_at=CLOCK,
        error="",
        started_at=CLOCK,
    )
    assert sender.log_text() == "hello\n"
    assert launcher.runs[0].released


def test_a_repeated_launch_of_a_running_attempt_only_re_reports_started(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    agent.handle_launch(LAUNCH)
    first = sender.started()
    agent.handle_launch(LAUNCH)
    assert len(launcher.runs) == 1
    assert sender.of_type(Started) == [first, first]


def test_a_repeated_launch_of_a_finished_attempt_re_reports_finished(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    agent.handle_launch(LAUNCH)
    sender.started()
    launcher.runs[0].exit(2)
    finished = sender.finished()
    assert agent.supervisor.join(5)
    agent.handle_launch(LAUNCH)
    assert len(launcher.runs) == 1
    assert sender.of_type(Finished) == [finished, finished]
    assert finished.outcome == "failed"


def test_a_new_attempt_of_the_same_job_is_a_separate_run(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    agent.handle_launch(LAUNCH)
    agent.handle_launch(make_launch(["python", "train.py"], attempt=1).to_dict())
    sender.started(1, 0)
    sender.started(1, 1)
    assert len(launcher.runs) == 2
    assert sorted((r.job_id, r.attempt) for r in agent.supervisor.running()) == [(1, 0), (1, 1)]


def test_a_stop_for_an_attempt_never_seen_reports_it_cancelled(
    agent: Agent, sender: RecordingSender
) -> None:
    agent.handle_stop(STOP)
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code) == ("cancelled", None)
    assert finished.error == "stopped (cancel) before it started on node-h"


def test_a_preempt_for_an_attempt_never_seen_reports_it_preempted(
    agent: Agent, sender: RecordingSender
) -> None:
    agent.handle_stop({**STOP, "reason": "preempt"})
    assert sender.finished().outcome == "preempted"


def test_a_launch_arriving_after_its_stop_never_starts(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    agent.handle_stop(STOP)
    cancelled = sender.finished()
    agent.handle_launch(LAUNCH)
    assert launcher.runs == []
    assert sender.of_type(Started) == []
    assert sender.of_type(Finished) == [cancelled, cancelled]


def test_a_stop_of_a_running_attempt_terminates_it_with_the_grace_given(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    agent.handle_launch(LAUNCH)
    sender.started()
    agent.handle_stop(STOP)
    finished = sender.finished()
    assert launcher.runs[0].terminated_with == [4.0]
    assert (finished.outcome, finished.exit_code, finished.error) == (
        "cancelled",
        143,
        "stopped: cancel",
    )


def test_a_stop_after_the_attempt_finished_re_reports_and_kills_nothing(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    agent.handle_launch(LAUNCH)
    sender.started()
    launcher.runs[0].exit(0)
    succeeded = sender.finished()
    assert agent.supervisor.join(5)
    agent.handle_stop(STOP)
    assert launcher.runs[0].terminated_with == []
    assert sender.of_type(Finished) == [succeeded, succeeded]


def test_a_stop_racing_a_natural_exit_keeps_the_real_outcome(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    agent.handle_launch(LAUNCH)
    sender.started()
    run = launcher.runs[0]
    run.code = 0  # exited, but the supervisor has not collected it yet
    agent.handle_stop(STOP)
    run.exit(0)
    assert sender.finished().outcome == "succeeded"
    assert run.terminated_with == []


def test_a_launcher_error_is_reported_as_launch_error(sender: RecordingSender) -> None:
    agent = make_agent(sender, ScriptedLauncher(fail_with=LaunchError("image not found: nope")))
    agent.handle_launch(LAUNCH)
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code, finished.error) == (
        "launch_error",
        None,
        "image not found: nope",
    )
    assert sender.of_type(Started) == []


def test_an_unexpected_launcher_error_names_its_type(sender: RecordingSender) -> None:
    agent = make_agent(sender, ScriptedLauncher(fail_with=OSError("disk full")))
    agent.handle_launch(LAUNCH)
    assert sender.finished().error == "OSError: disk full"


def test_a_malformed_message_is_dropped_and_logged(
    agent: Agent,
    sender: RecordingSender,
    launcher: ScriptedLauncher,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="workers.agent"):
        agent.handle_launch({**LAUNCH, "devices": []})
        agent.handle_launch(STOP)  # a stop sent to the launch task
    assert launcher.runs == [] and sender.messages == []
    assert "launch.devices: must list at least one device" in caplog.text
    assert "dropped a 'stop' message sent to the wrong task" in caplog.text


def test_a_failing_sender_does_not_lose_the_finished_report(launcher: ScriptedLauncher) -> None:
    sent: list[str] = []

    def flaky(message: object) -> None:
        if isinstance(message, Started):
            raise ConnectionError("broker down")
        sent.append(message.TYPE)  # type: ignore[attr-defined]

    agent = make_agent(flaky, launcher)  # type: ignore[arg-type]
    agent.handle_launch(LAUNCH)
    for _ in range(100):
        if launcher.runs:
            break
        agent.supervisor.join(0.05)
    launcher.runs[0].exit(0)
    assert agent.supervisor.join(5)
    assert sent == ["log", "finished"]


def test_the_heartbeat_carries_the_inventory_and_the_running_attempts(
    agent: Agent, sender: RecordingSender
) -> None:
    agent.handle_launch(LAUNCH)
    sender.started()
    agent.beat()
    heartbeat = sender.of_type(Heartbeat)[-1]
    assert heartbeat.node == "node-h"
    assert heartbeat.sent_at == CLOCK
    assert heartbeat.inventory == discover("node-h", source="described")
    assert heartbeat.running == (JobRef(job_id=1, attempt=0),)


def test_shutdown_reports_running_attempts_preempted_and_refuses_new_launches(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    agent.handle_launch(LAUNCH)
    sender.started()
    agent.close(grace_s=1.0)
    finished = sender.finished()
    assert (finished.outcome, finished.error) == ("preempted", "agent on node-h shut down")
    assert sender.of_type(Heartbeat)[-1].running == ()
    agent.handle_launch(make_launch(["python", "x.py"], job_id=2).to_dict())
    assert len(launcher.runs) == 1


def metrics_host() -> FakeNvml:
    whole = FakeGpu(uuid=GPU_0, used_mb=30000, util_pct=87)
    whole.mig_slots = [
        FakeMig(
            uuid=MIG_1,
            profile_id=19,
            gpu_instance_id=9,
            gpu_slices=1,
            compute_slices=1,
            memory_mb=9728,
            name="MIG 1g.10gb",
            used_mb=1200,
        )
    ]
    return FakeNvml([whole])


def test_metrics_report_utilisation_and_memory_of_a_whole_gpu(
    sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    agent = make_agent(sender, launcher, sampler=NvmlSampler(metrics_host()))
    agent.handle_launch(LAUNCH)
    sender.started()
    agent.beat()
    assert sender.of_type(Metrics) == [
        Metrics(
            node="node-h",
            job_id=1,
            attempt=0,
            gpu_util_pct=87.0,
            memory_used_mb=30000,
            sampled_at=CLOCK,
        )
    ]
    launcher.runs[0].exit(0)
    assert agent.supervisor.join(5)


def test_metrics_of_a_mig_slice_have_memory_but_no_utilisation_and_mps_has_none(
    sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    agent = make_agent(sender, launcher, sampler=NvmlSampler(metrics_host()))
    agent.handle_launch(make_launch(["a"], job_id=5, devices=(MIG_SLICE,)).to_dict())
    agent.handle_launch(make_launch(["b"], job_id=6, devices=(MPS_SHARE,)).to_dict())
    sender.started(5)
    sender.started(6)
    agent.beat()
    assert [(m.job_id, m.gpu_util_pct, m.memory_used_mb) for m in sender.of_type(Metrics)] == [
        (5, None, 1200)
    ]
    for run in launcher.runs:
        run.exit(0)
    assert agent.supervisor.join(5)


class GatedLauncher(ScriptedLauncher):
    """Its start() waits until the test opens the gate: a stop can arrive mid-start."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.entered = threading.Event()
        self.gate = threading.Event()

    def start(self, launch):  # type: ignore[no-untyped-def]
        self.entered.set()
        self.gate.wait(5)
        return super().start(launch)


def test_a_stop_during_start_terminates_the_run_as_soon_as_it_exists(
    sender: RecordingSender,
) -> None:
    launcher = GatedLauncher()
    agent = make_agent(sender, launcher)
    agent.handle_launch(LAUNCH)
    assert launcher.entered.wait(5)
    agent.handle_stop(STOP)
    launcher.gate.set()
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code) == ("cancelled", 143)
    assert launcher.runs[0].terminated_with == [4.0]
    assert sender.of_type(Started)[0].pid == 1000
