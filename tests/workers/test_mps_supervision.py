"""MPS, supervised (workers/mps.py): one control daemon per MPS GPU with its own pipe and log
directory, health checks with a timeout, restarts with backoff after a stale pipe is removed,
jobs on a dead daemon's GPU reported lost with MPS_SERVER_DIED, the agent's refusal to mix
teams on one daemon, and the server-side pinned memory limit.

The daemons are the FAKE nvidia-cuda-mps-control in tests/bin (no GPU here); the agent runs
it through its real code path (`-d`, `echo get_server_list | nvidia-cuda-mps-control`, ...)
and the tests look at what really happened: processes, files, the commands it received.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from agent_doubles import TEST_KEY, RecordingSender, ScriptedLauncher, make_launch, sealed
from mps_fake import (
    FAKE_MPS_CONTROL,
    alive,
    commands,
    daemon_pid,
    freeze_daemon,
    kill_daemon,
    mps_root,
    starts,
)

from workers.agent import Agent
from workers.inventory import described_inventory, discover
from workers.mps import CONTROL_PIPE, PID_FILE, MpsSupervisor
from workers.protocol import Ack, Device, Finished, Launch

NODE = "node-h"
INVENTORY = described_inventory(
    NODE, {"gpus": [{"mode": "whole"}, {"mode": "mps", "mps_shares": 4, "count": 2}]}
)
WHOLE, MPS_A, MPS_B = INVENTORY.gpus


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pipe(root: Path, gpu: str) -> Path:
    return root / gpu / "pipe"


def logs(root: Path, gpu: str) -> Path:
    return root / gpu / "log"


def share(gpu: object, number: int = 0, memory_mb: int = 20480) -> Device:
    return Device(
        slice_id=f"{gpu.uuid}/mps/{number}",  # type: ignore[attr-defined]
        kind="mps",
        gpu_uuid=gpu.uuid,  # type: ignore[attr-defined]
        gpu_index=gpu.index,  # type: ignore[attr-defined]
        mps_fraction=0.25,
        memory_mb=memory_mb,
    )


def mps_launch(job_id: int, *devices: Device, team: str = "vision") -> Launch:
    launch = make_launch(["python", "train.py"], job_id=job_id, devices=devices or (share(MPS_A),))
    return msgspec.structs.replace(launch, team=team)


@pytest.fixture
def root() -> Iterator[Path]:
    with mps_root() as path:
        yield path


def supervisor(root: Path, clock: Clock | None = None, **options: object) -> MpsSupervisor:
    settings: dict[str, object] = {"check_every_s": 2.0, "kill_grace_s": 1.0, **options}
    mps = MpsSupervisor(
        INVENTORY,
        root,
        binary=FAKE_MPS_CONTROL,
        clock=clock or Clock(),
        **settings,  # type: ignore[arg-type]
    )
    mps.prepare()
    return mps


# --- one daemon per GPU ------------------------------------------------------------------------


def test_described_mps_gpus_get_their_directories_and_no_daemon(tmp_path: Path) -> None:
    inventory = discover("node-m", source="described")
    mps = MpsSupervisor(inventory, tmp_path, binary=None)
    mps.prepare()
    (gpu,) = [g for g in inventory.gpus if g.mode == "mps"]
    assert (tmp_path / gpu.uuid / "pipe").is_dir() and (tmp_path / gpu.uuid / "log").is_dir()
    assert list((tmp_path / gpu.uuid / "pipe").iterdir()) == []
    assert not mps.supervised and mps.tick() == mps.check_every_s


def test_each_mps_gpu_gets_its_own_daemon_pipe_and_log_and_they_quit_at_stop(root: Path) -> None:
    mps = supervisor(root)

    pids = {daemon_pid(pipe(root, g.uuid)) for g in (MPS_A, MPS_B)}
    assert len(pids) == 2 and all(alive(p) for p in pids)
    for gpu in (MPS_A, MPS_B):
        assert (pipe(root, gpu.uuid) / CONTROL_PIPE).exists()
        (line,) = starts(logs(root, gpu.uuid))
        assert line.endswith(f"CUDA_VISIBLE_DEVICES={gpu.uuid}")  # that GPU only
    assert not (root / WHOLE.uuid).exists()  # a whole GPU has no daemon

    mps.stop()

    for gpu in (MPS_A, MPS_B):
        assert commands(logs(root, gpu.uuid))[-1] == "quit"
        assert list(pipe(root, gpu.uuid).iterdir()) == []
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_daemon_that_already_answers_is_adopted_and_left_running(root: Path) -> None:
    first = supervisor(root)
    running = daemon_pid(pipe(root, MPS_A.uuid))

    second = supervisor(root)  # the agent restarted: the daemons it started still answer
    assert daemon_pid(pipe(root, MPS_A.uuid)) == running
    assert len(starts(logs(root, MPS_A.uuid))) == 1
    second.stop()
    assert alive(running)  # not the new agent's to stop
    first.stop()


def test_a_stale_pipe_left_by_a_dead_daemon_is_removed_before_the_start(root: Path) -> None:
    first = supervisor(root)
    dead = kill_daemon(pipe(root, MPS_A.uuid))
    assert (pipe(root, MPS_A.uuid) / CONTROL_PIPE).exists()  # what blocks a plain restart

    second = supervisor(root)

    new = daemon_pid(pipe(root, MPS_A.uuid))
    assert new != dead and alive(new)
    assert second.daemons[MPS_A.uuid].up and second.daemons[MPS_A.uuid].started_here
    assert len(starts(logs(root, MPS_A.uuid))) == 2
    first.stop()
    second.stop()


# --- health checks, restarts and backoff -------------------------------------------------------


def test_a_crashed_daemon_is_restarted_at_once_then_after_growing_waits(root: Path) -> None:
    clock = Clock()
    mps = supervisor(root, clock)
    daemon = mps.daemons[MPS_A.uuid]
    clock.now += 60.0
    mps.tick()  # up 60 s: stable, the restart count starts again
    waits = []
    for _ in range(3):
        before = kill_daemon(pipe(root, MPS_A.uuid))
        clock.now += 2.0  # the next check
        mps.tick()
        assert not daemon.up and daemon.last_death == f"its process {before} is gone"
        assert daemon.restart_at is not None
        waits.append(daemon.restart_at - clock.now)
        clock.now = daemon.restart_at - 0.01
        mps.tick()
        assert not daemon.up  # not before its time
        clock.now = daemon.restart_at
        mps.tick()
        assert daemon.up and daemon_pid(pipe(root, MPS_A.uuid)) != before

    assert waits == [0.0, 1.0, 2.0]
    assert mps.daemons[MPS_B.uuid].generation == 1  # the other GPU's daemon was left alone
    mps.stop()


def test_a_daemon_that_will_not_start_is_retried_with_backoff_up_to_the_cap(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refuse = root / "refuse-start"
    refuse.touch()
    monkeypatch.setenv("FAKE_MPS_REFUSE_START", str(refuse))
    clock = Clock()
    mps = supervisor(root, clock, backoff_max_s=4.0)
    daemon = mps.daemons[MPS_A.uuid]
    waits = []
    for _ in range(4):
        assert not daemon.up and daemon.restart_at is not None
        waits.append(daemon.restart_at - clock.now)
        clock.now = daemon.restart_at
        mps.tick()
    assert waits == [1.0, 2.0, 4.0, 4.0]

    refuse.unlink()
    clock.now = daemon.restart_at
    mps.tick()
    assert daemon.up and alive(daemon_pid(pipe(root, MPS_A.uuid)))
    mps.stop()


def test_a_hung_daemon_times_out_and_after_repeated_time_outs_is_killed_and_replaced(
    root: Path,
) -> None:
    clock = Clock()
    mps = supervisor(root, clock, check_timeout_s=1.0, unanswered_limit=2)
    daemon = mps.daemons[MPS_A.uuid]
    hung = freeze_daemon(pipe(root, MPS_A.uuid))

    clock.now += 2.0
    began = time.monotonic()
    mps.tick()
    took = time.monotonic() - began
    assert 1.0 <= took < 4.0  # the check gave up after its timeout
    assert daemon.up and daemon.unanswered == 1  # one late answer is not a death

    clock.now += 2.0
    mps.tick()  # the second time-out in a row: dead
    assert not daemon.up
    assert daemon.last_death == "get_server_list got no answer within 1 s, 2 times in a row"
    clock.now = daemon.restart_at or clock.now
    mps.tick()
    assert daemon.up and not alive(hung)
    assert daemon_pid(pipe(root, MPS_A.uuid)) != hung
    mps.stop()


def test_a_pipe_nobody_answers_on_counts_as_a_dead_daemon(root: Path) -> None:
    """No pid file to go by (a daemon of a driver that writes none): the client's own
    failure to reach the daemon says it."""
    clock = Clock()
    mps = supervisor(root, clock)
    daemon = mps.daemons[MPS_A.uuid]
    kill_daemon(pipe(root, MPS_A.uuid))
    (pipe(root, MPS_A.uuid) / PID_FILE).unlink()

    clock.now += 2.0
    mps.tick()

    assert not daemon.up
    assert daemon.last_death == (
        "get_server_list failed (exit 1): Cannot find MPS control daemon process (Connection "
        "refused)"
    )
    clock.now = daemon.restart_at or clock.now
    mps.tick()
    assert daemon.up  # the stale `control` was removed, or `-d` would have refused
    mps.stop()


# --- jobs on a daemon that died ------------------------------------------------------------------


def make_agent(
    root: Path,
    sender: RecordingSender,
    launcher: ScriptedLauncher,
    workdir: Path,
    **options: object,
) -> tuple[Agent, MpsSupervisor]:
    mps = supervisor(root, **options)  # type: ignore[arg-type]
    agent = Agent(
        node=NODE,
        inventory=INVENTORY,
        launcher=launcher,
        send=sender,
        workdir=workdir,
        key=TEST_KEY,
        kill_grace_s=1.0,
        boot="boot-1",
        write_lease_file=False,
        mps=mps,
    )
    heartbeat = agent.heartbeat()
    ack = Ack(node=NODE, boot=agent.boot, heartbeat_seq=heartbeat.seq, lease_s=3600.0)
    agent.handle(sealed(ack, now=time.time()))
    return agent, mps


def launch(agent: Agent, message: Launch) -> None:
    agent.handle(sealed(message, now=time.time()))


@pytest.fixture
def launcher() -> ScriptedLauncher:
    return ScriptedLauncher()


@pytest.fixture
def agent_and_mps(
    root: Path, sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> Iterator[tuple[Agent, MpsSupervisor]]:
    agent, mps = make_agent(root, sender, launcher, tmp_path / "agent")
    yield agent, mps
    for run in launcher.runs:
        if run.code is None:
            run.exit(0)
    assert agent.supervisor.join(5)
    mps.stop()


def test_jobs_on_a_dead_daemons_gpu_are_stopped_and_reported_lost_with_mps_server_died(
    agent_and_mps: tuple[Agent, MpsSupervisor],
    sender: RecordingSender,
    launcher: ScriptedLauncher,
    root: Path,
) -> None:
    agent, mps = agent_and_mps
    launch(agent, mps_launch(1, share(MPS_A, 0)))
    launch(agent, mps_launch(2, share(MPS_A, 1), share(MPS_A, 2)))
    launch(agent, mps_launch(3, share(MPS_B, 0)))
    whole = Device(slice_id=WHOLE.uuid, kind="whole", gpu_uuid=WHOLE.uuid, gpu_index=0)
    launch(agent, mps_launch(4, whole))
    for job in (1, 2, 3, 4):
        sender.started(job)

    dead = kill_daemon(pipe(root, MPS_A.uuid))
    mps._clock.now += 2.0  # type: ignore[attr-defined]
    mps.tick()

    for job in (1, 2):
        finished = sender.finished(job)
        assert (finished.outcome, finished.exit_code) == ("lost", 143)
        assert finished.error == (
            f"MPS_SERVER_DIED: the MPS control daemon of {MPS_A.uuid} died (its process {dead} "
            "is gone)"
        )
    run_of = {sender.started(job).pid: job for job in (1, 2, 3, 4)}
    stopped = {run_of[r.pid]: r.terminated_with for r in launcher.runs}
    assert stopped == {1: [1.0], 2: [1.0], 3: [], 4: []}  # SIGTERM, kill after the grace
    running = {(r.job_id, r.attempt) for r in agent.supervisor.running()}
    assert running == {(3, 0), (4, 0)}  # the other MPS GPU and the whole GPU: untouched


def test_a_job_that_fails_as_its_daemon_dies_is_reported_lost_not_failed(
    agent_and_mps: tuple[Agent, MpsSupervisor],
    sender: RecordingSender,
    launcher: ScriptedLauncher,
    root: Path,
) -> None:
    agent, _ = agent_and_mps
    launch(agent, mps_launch(1))
    sender.started(1)

    kill_daemon(pipe(root, MPS_A.uuid))
    launcher.runs[0].exit(1)  # its CUDA calls failed before any health check ran

    finished = sender.finished(1)
    assert (finished.outcome, finished.exit_code) == ("lost", 1)
    assert finished.error.startswith(f"MPS_SERVER_DIED: the MPS control daemon of {MPS_A.uuid}")


def test_a_job_that_failed_on_a_healthy_daemon_keeps_its_failure(
    agent_and_mps: tuple[Agent, MpsSupervisor], sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    agent, _ = agent_and_mps
    launch(agent, mps_launch(1))
    sender.started(1)
    launcher.runs[0].exit(3)
    assert (sender.finished(1).outcome, sender.finished(1).error) == ("failed", "exit code 3")


def test_a_job_that_succeeded_before_its_daemon_died_keeps_its_success(
    agent_and_mps: tuple[Agent, MpsSupervisor],
    sender: RecordingSender,
    launcher: ScriptedLauncher,
    root: Path,
) -> None:
    agent, mps = agent_and_mps
    launch(agent, mps_launch(1))
    sender.started(1)
    launcher.runs[0].exit(0)
    assert sender.finished(1).outcome == "succeeded"
    kill_daemon(pipe(root, MPS_A.uuid))
    mps._clock.now += 2.0  # type: ignore[attr-defined]
    mps.tick()
    assert [f.outcome for f in sender.of_type(Finished)] == ["succeeded"]


def test_the_agents_own_thread_finds_a_dead_daemon_within_a_check_period(
    root: Path, sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    """What an operator sees without anyone calling tick(): the agent's `mps` thread."""
    agent, mps = make_agent(
        root, sender, launcher, tmp_path / "agent", clock=time.monotonic, check_every_s=0.5
    )
    agent.start(heartbeat_s=0.5)
    try:
        launch(agent, mps_launch(1))
        sender.started(1)
        killed_at = time.monotonic()
        kill_daemon(pipe(root, MPS_A.uuid))
        finished = sender.finished(1, timeout=10)
        took = time.monotonic() - killed_at
        assert finished.outcome == "lost" and finished.error.startswith("MPS_SERVER_DIED")
        assert took < 3.0  # one check period (0.5 s), the check, the stop; on a busy host
        deadline = time.monotonic() + 10
        while not (mps.daemons[MPS_A.uuid].up and mps.daemons[MPS_A.uuid].generation == 2):
            assert time.monotonic() < deadline, "the daemon was not restarted"
            time.sleep(0.05)
        assert len(starts(logs(root, MPS_A.uuid))) == 2
    finally:
        agent.close(grace_s=1.0)
        mps.stop()


def test_a_launch_waits_for_a_restarting_daemon_then_fails_with_mps_server_down(
    root: Path,
    sender: RecordingSender,
    launcher: ScriptedLauncher,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refuse = root / "refuse-start"
    monkeypatch.setenv("FAKE_MPS_REFUSE_START", str(refuse))
    agent, mps = make_agent(root, sender, launcher, tmp_path / "agent", launch_wait_s=0.3)
    refuse.touch()
    kill_daemon(pipe(root, MPS_A.uuid))
    mps._clock.now += 2.0  # type: ignore[attr-defined]
    mps.tick()  # dead; the restart at once fails too
    assert not mps.daemons[MPS_A.uuid].up

    launch(agent, mps_launch(1))

    finished = sender.finished(1)
    assert finished.outcome == "launch_error" and launcher.runs == []
    assert finished.error.startswith(
        f"MPS_SERVER_DOWN: the MPS control daemon of {MPS_A.uuid} is not running (last: "
    )
    mps.stop()


# --- never two teams on one daemon ------------------------------------------------------------


def test_the_agent_refuses_a_launch_that_would_mix_teams_on_one_mps_gpu(
    agent_and_mps: tuple[Agent, MpsSupervisor], sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    agent, mps = agent_and_mps
    launch(agent, mps_launch(1, share(MPS_A, 0), team="vision"))
    sender.started(1)

    launch(agent, mps_launch(2, share(MPS_A, 1), team="nlp"))
    launch(agent, mps_launch(3, share(MPS_A, 2), team="vision"))
    launch(agent, mps_launch(4, share(MPS_B, 0), team="nlp"))  # another GPU, its own daemon

    refused = sender.finished(2)
    assert (refused.outcome, refused.error) == (
        "launch_error",
        f"MPS_TEAM_MIX: the MPS daemon of {MPS_A.uuid} serves team 'vision' (job 1); a job "
        "of team 'nlp' may not share it",
    )
    sender.started(3)
    sender.started(4)
    assert len(launcher.runs) == 3

    launcher.runs[0].exit(0)
    launcher.runs[1].exit(0)
    sender.finished(1)
    sender.finished(3)
    deadline = time.monotonic() + 5
    while mps.daemons[MPS_A.uuid].runs:  # released once their output was read
        assert time.monotonic() < deadline
        time.sleep(0.01)
    launch(agent, mps_launch(5, share(MPS_A, 1), team="nlp"))  # the GPU is free of vision now
    sender.started(5)


def test_an_mps_launch_for_a_gpu_this_node_does_not_run_in_mps_mode_is_refused(
    agent_and_mps: tuple[Agent, MpsSupervisor], sender: RecordingSender
) -> None:
    agent, _ = agent_and_mps
    launch(agent, mps_launch(1, share(WHOLE, 0)))
    finished = sender.finished(1)
    assert (finished.outcome, finished.error) == (
        "launch_error",
        f"MPS shares on {WHOLE.uuid}, which this node does not run in MPS mode",
    )


# --- memory limits on the server side ---------------------------------------------------------


def test_the_daemons_pinned_memory_limit_follows_the_largest_job_on_its_gpu(
    agent_and_mps: tuple[Agent, MpsSupervisor], sender: RecordingSender, root: Path
) -> None:
    agent, mps = agent_and_mps
    launch(agent, mps_launch(1, share(MPS_A, 0, memory_mb=20480)))
    sender.started(1)
    mps._control(mps.daemons[MPS_A.uuid], "start_server -uid 0", 5.0)  # a client's server
    server = mps._control(mps.daemons[MPS_A.uuid], "get_server_list", 5.0).stdout.strip()
    launch(agent, mps_launch(2, share(MPS_A, 1, memory_mb=20480), share(MPS_A, 2, 20480)))
    sender.started(2)
    launch(agent, mps_launch(3, share(MPS_A, 3, memory_mb=20480)))
    sender.started(3)

    assert [c for c in commands(logs(root, MPS_A.uuid)) if "mem_limit" in c] == [
        "set_default_device_pinned_mem_limit 0 20480M",
        "set_default_device_pinned_mem_limit 0 40960M",
        f"set_device_pinned_mem_limit {server} 0 40960M",
    ]  # job 3 (20480 MB) changed nothing: the largest job on the GPU still has 40960 MB


def test_a_driver_without_the_limit_command_keeps_the_client_limit_only(
    root: Path,
    sender: RecordingSender,
    launcher: ScriptedLauncher,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAKE_MPS_NO_MEM_LIMIT", "1")
    agent, mps = make_agent(root, sender, launcher, tmp_path / "agent")
    launch(agent, mps_launch(1, share(MPS_A, 0, memory_mb=20480)))
    sender.started(1)
    launch(agent, mps_launch(2, share(MPS_A, 1, memory_mb=40960)))
    sender.started(2)
    tried = [c for c in commands(logs(root, MPS_A.uuid)) if "mem_limit" in c]
    assert tried == ["set_default_device_pinned_mem_limit 0 20480M"]  # tried once, then not
    assert not mps.daemons[MPS_A.uuid].limit_taken
    for run in launcher.runs:
        run.exit(0)
    assert agent.supervisor.join(5)
    mps.stop()
