"""The process launcher running real commands under the supervisor, reports recorded."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from agent_doubles import GPU_0, GPU_3, MPS_SHARE, RecordingSender, make_launch
from job_processes import (
    launcher,
    needs_root,
    python_for_job_uids,
    scratch_dir_others_may_enter,
    supervisor_for,
)

from workers.launchers.process import ProcessLauncher
from workers.outbox import AttemptJournal
from workers.protocol import LOG_CHUNK_MAX_BYTES, Finished, Started, Stop
from workers.supervisor import Supervisor

PY = sys.executable
# These tests read the job's own output: their launchers count the tests' image as the host's,
# so the log has no image note (test_process_limits.py tests the note and the refusal).
HOST_IMAGES = ("python:3.11-slim",)


@pytest.fixture
def supervisor(tmp_path: Path, sender: RecordingSender) -> Supervisor:
    jobs = launcher(tmp_path / "agent", mps_root=tmp_path / "mps", host_images=HOST_IMAGES)
    supervisor = supervisor_for(jobs, sender, tmp_path / "attempts")
    yield supervisor
    supervisor.shutdown(grace_s=0.5)


def python(code: str) -> list[str]:
    return [PY, "-c", code]


def test_a_job_sees_its_gpu_in_cuda_visible_devices_and_succeeds(
    supervisor: Supervisor, sender: RecordingSender
) -> None:
    supervisor.launch(make_launch(python("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")))
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code, finished.error) == ("succeeded", 0, "")
    assert sender.log_text() == f"{GPU_0}\n"
    started = sender.started()
    assert started.pid is not None and started.container_id is None
    assert started.node == "node-t"
    types = [m.TYPE for m in sender.messages]
    assert types[0] == "started" and types[-1] == "finished"


def test_an_mps_job_gets_its_pipe_directory_and_thread_percentage(
    supervisor: Supervisor, sender: RecordingSender, tmp_path: Path
) -> None:
    code = (
        "import os; e = os.environ; "
        "print(e['CUDA_VISIBLE_DEVICES'], e['CUDA_MPS_PIPE_DIRECTORY'], "
        "e['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'], e['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'])"
    )
    supervisor.launch(make_launch(python(code), devices=(MPS_SHARE,)))
    assert sender.finished().outcome == "succeeded"
    assert sender.log_text() == f"{GPU_3} {tmp_path / 'mps' / GPU_3 / 'pipe'} 25 0=20480M\n"


def test_a_job_runs_in_its_own_work_directory_with_the_agents_path(
    supervisor: Supervisor, sender: RecordingSender, tmp_path: Path
) -> None:
    code = "import os; print(os.getcwd()); print(os.environ['HOME']); print(os.environ['PATH'])"
    supervisor.launch(make_launch(python(code), job_id=7, attempt=3))
    assert sender.finished(7, 3).outcome == "succeeded"
    work_dir = tmp_path / "agent" / "jobs" / "7-3" / "work"
    assert sender.log_text(7, 3) == f"{work_dir}\n{work_dir}\n{os.environ['PATH']}\n"


def test_a_nonzero_exit_is_reported_as_failed_with_its_code(
    supervisor: Supervisor, sender: RecordingSender
) -> None:
    supervisor.launch(
        make_launch(python("import sys; print('bad input', file=sys.stderr); sys.exit(3)"))
    )
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code, finished.error) == ("failed", 3, "exit code 3")
    assert sender.log_text() == "bad input\n"


def test_a_missing_command_is_a_launch_error_without_a_start(
    supervisor: Supervisor, sender: RecordingSender
) -> None:
    supervisor.launch(make_launch(["/no/such/program", "--help"]))
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code) == ("launch_error", None)
    assert finished.error == "command not found: /no/such/program"
    assert sender.of_type(Started) == []


def test_the_time_limit_ends_a_job_as_timed_out(
    supervisor: Supervisor, sender: RecordingSender
) -> None:
    began = time.monotonic()
    supervisor.launch(make_launch(python("import time; time.sleep(60)"), time_limit_s=0.5))
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code) == ("timed_out", 143)  # 128 + SIGTERM
    assert finished.error == "stopped: time limit"
    assert time.monotonic() - began < 10


def test_stop_cancels_a_running_job(supervisor: Supervisor, sender: RecordingSender) -> None:
    supervisor.launch(
        make_launch(python("import time; print('working', flush=True); time.sleep(60)"))
    )
    sender.wait_for(lambda m: getattr(m, "data", "") == "working\n")
    supervisor.stop(Stop(node="node-h", job_id=1, attempt=0, reason="cancel", grace_s=5.0))
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code, finished.error) == (
        "cancelled",
        143,
        "stopped: cancel",
    )


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace_period(
    supervisor: Supervisor, sender: RecordingSender
) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    supervisor.launch(make_launch(python(code)))
    sender.wait_for(lambda m: getattr(m, "data", "") == "ready\n")
    began = time.monotonic()
    supervisor.stop(Stop(node="node-h", job_id=1, attempt=0, reason="preempt", grace_s=0.5))
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code) == ("preempted", 137)  # 128 + SIGKILL
    assert 0.4 < time.monotonic() - began < 10


def test_processes_a_job_leaves_behind_are_killed_when_it_ends(
    supervisor: Supervisor, sender: RecordingSender
) -> None:
    code = (
        "import subprocess, sys; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
        "print(child.pid, flush=True)"
    )
    began = time.monotonic()
    supervisor.launch(make_launch(python(code)))
    finished = sender.finished()
    assert finished.outcome == "succeeded"
    assert time.monotonic() - began < 8  # not held open by the child's copy of the pipe
    child = int(sender.log_text().strip())
    status = Path(f"/proc/{child}/status")
    deadline = time.monotonic() + 5
    while status.exists() and "State:\tZ" not in status.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not status.exists() or "State:\tZ" in status.read_text()


def test_output_larger_than_a_chunk_arrives_whole_in_numbered_chunks(
    supervisor: Supervisor, sender: RecordingSender
) -> None:
    # 3-byte characters make chunk edges fall inside characters unless the shipper cares.
    code = "import sys; sys.stdout.write('€' * 100000 + 'end\\n')"
    supervisor.launch(make_launch(python(code), env={"PYTHONIOENCODING": "utf-8"}))
    assert sender.finished().outcome == "succeeded"
    assert sender.log_text() == "€" * 100000 + "end\n"
    sizes = [len(m.data.encode()) for m in sender.messages if m.TYPE == "log"]
    assert len(sizes) >= 5 and max(sizes) <= LOG_CHUNK_MAX_BYTES


def test_invalid_utf8_output_is_shipped_with_replacement_characters(
    supervisor: Supervisor, sender: RecordingSender
) -> None:
    code = "import sys; sys.stdout.buffer.write(b'ok \\xff\\xfe done\\n')"
    supervisor.launch(make_launch(python(code)))
    assert sender.finished().outcome == "succeeded"
    assert sender.log_text() == "ok \ufffd\ufffd done\n"


def test_a_reserved_variable_in_the_users_env_is_ignored_and_said_so(
    supervisor: Supervisor, sender: RecordingSender
) -> None:
    launch = make_launch(
        python("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"),
        env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
    )
    supervisor.launch(launch)
    assert sender.finished().outcome == "succeeded"
    assert sender.log_text() == (
        f"[agent] ignored env set by the agent for the slice: CUDA_VISIBLE_DEVICES\n{GPU_0}\n"
    )


def test_shutdown_stops_running_jobs_as_preempted(
    supervisor: Supervisor, sender: RecordingSender
) -> None:
    supervisor.launch(make_launch(python("import time; print('up', flush=True); time.sleep(60)")))
    sender.wait_for(lambda m: getattr(m, "data", "") == "up\n")
    supervisor.shutdown(grace_s=2.0)
    finished = sender.of_type(Finished)
    assert [(f.outcome, f.error) for f in finished] == [("preempted", "agent on node-t shut down")]
    assert supervisor.running() == []


def restarted_supervisor(tmp_path: Path, sender: RecordingSender) -> Supervisor:
    """A second agent run on the same work directory whose journal was lost: only the
    launcher's own record of the attempt directory stands between it and a second run."""
    jobs = launcher(tmp_path / "agent", mps_root=tmp_path / "mps", host_images=HOST_IMAGES)
    return supervisor_for(jobs, sender, tmp_path / "attempts-after-loss", kill_grace_s=0.5)


def test_an_attempt_still_running_from_an_earlier_agent_run_is_not_started_twice(
    supervisor: Supervisor, sender: RecordingSender, tmp_path: Path
) -> None:
    launch = make_launch(python("import time; print('up', flush=True); time.sleep(60)"))
    supervisor.launch(launch)
    sender.wait_for(lambda m: getattr(m, "data", "") == "up\n")
    after_restart = RecordingSender()
    restarted = restarted_supervisor(tmp_path, after_restart)
    restarted.launch(launch)
    finished = after_restart.finished()
    assert (finished.outcome, finished.exit_code) == ("launch_error", None)
    assert finished.error.startswith("attempt already running on this node, started by an earlier")
    assert after_restart.of_type(Started) == []


def test_the_work_dir_of_a_dead_earlier_attempt_is_moved_aside_and_the_job_runs(
    supervisor: Supervisor, sender: RecordingSender, tmp_path: Path
) -> None:
    launch = make_launch(python("print('run')"))
    supervisor.launch(launch)
    assert sender.finished().outcome == "succeeded"
    after_reset = RecordingSender()
    restarted_supervisor(tmp_path, after_reset).launch(launch)
    assert after_reset.finished().outcome == "succeeded"
    assert after_reset.log_text() == "run\n"
    jobs = sorted(p.name for p in (tmp_path / "agent" / "jobs").iterdir())
    assert jobs[0] == "1-0" and jobs[1].startswith("1-0.replaced-") and len(jobs) == 2


@needs_root
def test_jobs_fenced_while_another_agent_restarts_on_the_host_are_all_reported_fenced() -> None:
    # The chaos run that failed a job: agent A had run attempts as uids that agent B's jobs
    # now run as; A restarted and swept those uids as leftovers just as B's lease lapsed, so
    # one of B's jobs died of SIGKILL without a SIGTERM and was reported failed (137).
    pool = (61980, 61982)
    python, env = python_for_job_uids()
    up = "import time; print('up', flush=True); time.sleep(60)"
    with scratch_dir_others_may_enter() as root:
        earlier = ProcessLauncher(workdir=root / "a", mps_root=root / "mps", job_uids=pool)
        for job_id in (1, 2, 3):
            run = earlier.start(make_launch([python, "-c", "pass"], job_id=job_id, env=env))
            assert run.wait() == 0
            run.reap()
            run.release()

        sender = RecordingSender()
        node_b = Supervisor(
            node="node-b",
            launcher=ProcessLauncher(workdir=root / "b", mps_root=root / "mps", job_uids=pool),
            report=lambda message: sender(message) or True,
            journal=AttemptJournal(root / "b-attempts"),
        )
        for job_id in (1, 2, 3):
            node_b.launch(make_launch([python, "-c", up], job_id=job_id, env=env))
        for job_id in (1, 2, 3):
            sender.wait_for(lambda m, j=job_id: getattr(m, "data", "") == "up\n" and m.job_id == j)

        restarted = ProcessLauncher(workdir=root / "a", mps_root=root / "mps", job_uids=pool)
        assert restarted.reap_leftovers(keep=set()) == []
        assert node_b.fence("the lease ran out", 2.0) == 3
        outcomes = [(sender.finished(j).outcome, sender.finished(j).exit_code) for j in (1, 2, 3)]
        assert outcomes == [("fenced", 143)] * 3
        assert node_b.join(5)
