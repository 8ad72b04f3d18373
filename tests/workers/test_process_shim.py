"""The process launcher's shim: lifeline, lease fencing, leftovers, job uids. Real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_doubles import make_launch
from job_processes import (
    IS_ROOT,
    alive,
    eventually,
    first_line,
    group_members,
    launcher,
    needs_root,
    python_for_job_uids,
    start_agent,
)

from workers.launch import LaunchError, LeaseLapsed
from workers.launchers.process import JobUids, claim_uid, isolation_summary
from workers.lease import Lease, write_lease
from workers.settings import AgentSettings
from workers.shim import ExitRecord, read_exit, read_record

SLEEPER = ["sh", "-c", "sleep 300 & echo $!; wait"]  # prints its grandchild's pid
POOL = (61000, 61009)
PROJECT = Path(__file__).resolve().parents[2]


def lease_for(path: Path, seconds: float) -> Path:
    write_lease(path, Lease(valid_until=time.time() + seconds, boot="test"))
    return path


def test_the_job_runs_under_its_shim_and_its_exit_code_comes_back(tmp_path: Path) -> None:
    run = launcher(tmp_path).start(make_launch(["sh", "-c", "echo out; echo err >&2; exit 3"]))
    assert b"".join(run.output()) == b"out\nerr\n"
    assert run.wait() == 3
    assert run.fenced() is None
    status = Path(f"/proc/{os.getpid()}/status")  # the job is the shim's child, not ours
    assert status.exists() and run.pid is not None and run.pid != os.getpid()
    run.reap()
    run.release()


def test_death_by_a_signal_is_128_plus_the_signal(tmp_path: Path) -> None:
    run = launcher(tmp_path).start(make_launch(["sh", "-c", "kill -9 $$"]))
    assert run.wait() == 128 + signal.SIGKILL


def test_terminate_stops_the_whole_group_and_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    command = ["sh", "-c", "trap '' TERM; sleep 300 & echo $!; wait"]
    run = launcher(tmp_path).start(make_launch(command))
    grandchild = int(first_line(run))
    began = time.monotonic()
    run.terminate(0.5)
    assert run.wait() == 128 + signal.SIGKILL
    assert 0.4 < time.monotonic() - began < 5
    eventually(lambda: not alive(grandchild), within=2)


def test_killing_the_agent_kills_the_job_and_its_grandchild_within_a_second(
    tmp_path: Path,
) -> None:
    agent, job = start_agent(workdir=tmp_path / "agent", command=SLEEPER)
    pgid, grandchild = job["pgid"], int(job["line"])
    assert group_members(pgid) and alive(grandchild)
    agent.kill()
    agent.wait()
    took = eventually(lambda: not group_members(pgid) and not alive(grandchild), within=1.0)
    assert took < 1.0


def test_an_expired_lease_fences_the_job_and_says_why(tmp_path: Path) -> None:
    # The lease lapses once the job is up (a lease too short to start on would make the start,
    # not the fence, what a loaded machine tests).
    lease = lease_for(tmp_path / "lease.json", 30.0)
    run = launcher(tmp_path / "agent", lease_path=lease, fence_grace_s=0.5).start(
        make_launch(["sh", "-c", "echo up; exec sleep 300"])
    )
    assert first_line(run) == "up"
    lease_for(lease, -0.01)
    lapsed = time.monotonic()
    assert run.wait() == 128 + signal.SIGTERM
    assert time.monotonic() - lapsed < 0.5 + 3.0  # the shim looks every 0.5 s
    reason = run.fenced()
    assert reason is not None and reason.startswith("lease expired at ")
    assert "stopped with SIGTERM, SIGKILL after 0.5s" in reason


def test_a_fenced_job_that_ignores_sigterm_is_killed_after_the_fence_grace(
    tmp_path: Path,
) -> None:
    lease = lease_for(tmp_path / "lease.json", 30.0)
    command = ["sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.1; done"]
    run = launcher(tmp_path / "agent", lease_path=lease, fence_grace_s=0.5).start(
        make_launch(command)
    )
    assert first_line(run) == "up"
    lease_for(lease, -0.01)
    lapsed = time.monotonic()
    assert run.wait() == 128 + signal.SIGKILL
    assert 0.5 <= time.monotonic() - lapsed < 0.5 + 0.5 + 3.0  # look, grace, slack
    assert run.fenced() is not None


def test_a_renewed_lease_keeps_the_job_running(tmp_path: Path) -> None:
    lease = lease_for(tmp_path / "lease.json", 1.0)
    run = launcher(tmp_path / "agent", lease_path=lease, fence_grace_s=0.5).start(
        make_launch(["sleep", "2.5"])
    )
    for _ in range(5):
        time.sleep(0.5)
        lease_for(lease, 1.0)
    assert run.wait() == 0
    assert run.fenced() is None


def test_fencing_works_while_the_agent_is_frozen(tmp_path: Path) -> None:
    lease = lease_for(tmp_path / "lease.json", 1.5)
    agent, job = start_agent(
        workdir=tmp_path / "agent", command=SLEEPER, lease=lease, fence_grace_s=0.5
    )
    pgid, grandchild = job["pgid"], int(job["line"])
    os.kill(agent.pid, signal.SIGSTOP)
    try:
        eventually(lambda: not group_members(pgid) and not alive(grandchild), within=1.5 + 2.0)
        reason = (Path(job["attempt_dir"]) / "fenced").read_text()
        assert reason.startswith("lease expired at ")
    finally:
        agent.kill()
        os.kill(agent.pid, signal.SIGCONT)
        agent.wait()


def shim_pid(attempt_dir: Path) -> int:
    return read_record(attempt_dir)["shim"]


def test_the_shim_records_each_exit_and_whether_a_stop_reached_the_job(tmp_path: Path) -> None:
    own = launcher(tmp_path).start(make_launch(["sh", "-c", "exit 3"]))
    assert own.wait() == 3
    assert read_exit(own.attempt_dir) == ExitRecord(3, False) and not own.stop_reached()
    stopped = launcher(tmp_path).start(make_launch(SLEEPER, job_id=2))
    first_line(stopped)
    stopped.terminate(1.0)
    assert stopped.wait() == 128 + signal.SIGTERM
    assert read_exit(stopped.attempt_dir) == ExitRecord(128 + signal.SIGTERM, True)
    assert stopped.stop_reached()


def test_a_job_that_ended_as_its_lease_lapsed_is_not_fenced(tmp_path: Path) -> None:
    # The shim is slow (frozen here) while the job ends on its own and the lease lapses: the
    # job's result stands. Reporting it fenced would have the portal run it again. (The shim
    # looks at the job's exit before it fences or signals; this cannot time that window.)
    lease = lease_for(tmp_path / "lease.json", 30.0)
    command = ["sh", "-c", "echo up; sleep 0.5"]  # (its output pipe is closed once read)
    run = launcher(tmp_path / "agent", lease_path=lease, fence_grace_s=0.5).start(
        make_launch(command)
    )
    assert first_line(run) == "up"
    shim = shim_pid(run.attempt_dir)
    os.kill(shim, signal.SIGSTOP)
    try:
        eventually(lambda: not alive(run.pid or 0), within=3)  # the job ended meanwhile
        lease_for(lease, -1.0)
    finally:
        os.kill(shim, signal.SIGCONT)
    assert run.wait() == 0
    assert run.fenced() is None
    assert read_exit(run.attempt_dir) == ExitRecord(0, False) and not run.stop_reached()


def test_a_job_that_ended_just_before_its_agent_died_keeps_its_result_for_the_next_agent(
    tmp_path: Path,
) -> None:
    # The job has exited, but its shim (frozen here) has not yet told the agent, which is
    # killed: the shim records the job's own exit and the restarted agent reports it.
    agent, job = start_agent(
        workdir=tmp_path / "agent",
        command=["sh", "-c", "echo up; sleep 0.5; echo 'the last words'; exit 7"],
    )
    attempt_dir = Path(job["attempt_dir"])
    shim = shim_pid(attempt_dir)
    os.kill(shim, signal.SIGSTOP)
    try:
        eventually(lambda: not alive(job["pgid"]), within=3)
        agent.kill()
        agent.wait()
    finally:
        os.kill(shim, signal.SIGCONT)
    eventually(lambda: not alive(shim), within=3)
    assert read_exit(attempt_dir) == ExitRecord(7, False)
    after = launcher(tmp_path / "agent")
    assert after.reap_leftovers(keep=set()) == []
    ended = after.ended_runs([(1, 0), (9, 0)])
    assert list(ended) == [(1, 0)]
    assert ended[(1, 0)].wait() == 7 and not ended[(1, 0)].stop_reached()
    # What the job wrote after the dead agent's last read is still there, from any offset.
    assert b"".join(ended[(1, 0)].output()) == b"up\nthe last words\n"
    assert b"".join(ended[(1, 0)].output(3)) == b"the last words\n"


def test_a_job_killed_with_its_agent_is_not_handed_over_as_ended(tmp_path: Path) -> None:
    agent, job = start_agent(workdir=tmp_path / "agent", command=SLEEPER)
    agent.kill()
    agent.wait()
    attempt_dir = Path(job["attempt_dir"])
    eventually(lambda: read_exit(attempt_dir) is not None, within=3)
    assert read_exit(attempt_dir) == ExitRecord(128 + signal.SIGKILL, True)
    assert launcher(tmp_path / "agent").ended_runs([(1, 0)]) == {}


def test_a_job_is_not_started_once_the_lease_has_expired(tmp_path: Path) -> None:
    lease = lease_for(tmp_path / "lease.json", -1.0)
    marker = tmp_path / "ran"
    with pytest.raises(LaunchError, match="^the agent's lease has expired: not starting"):
        launcher(tmp_path / "agent", lease_path=lease).start(make_launch(["touch", str(marker)]))
    assert not marker.exists()


def test_a_launch_accepted_in_an_earlier_lease_epoch_is_not_started(tmp_path: Path) -> None:
    # Seen in the short chaos run: an agent accepted a launch, was frozen, thawed, fenced
    # (its lease had run out) and acknowledged again before the shim looked. The lease was
    # valid by then, but the portal had requeued the attempt elsewhere: started, it ran
    # beside its successor until the portal's stop reached it (8 ms).
    lease = tmp_path / "lease.json"
    write_lease(lease, Lease(valid_until=time.time() + 30, boot="test", epoch=1))
    marker = tmp_path / "ran"
    jobs = launcher(tmp_path / "agent", lease_path=lease)
    with pytest.raises(LeaseLapsed, match="accepted in lease epoch 0; the lease ran out since"):
        jobs.start(make_launch(["touch", str(marker)]), lease_epoch=0)
    assert not marker.exists()
    run = jobs.start(make_launch(["touch", str(marker)], job_id=2), lease_epoch=1)
    assert run.wait() == 0 and marker.exists()


def test_a_missing_lease_file_fences_like_an_expired_one(tmp_path: Path) -> None:
    lease = lease_for(tmp_path / "lease.json", 5.0)
    run = launcher(tmp_path / "agent", lease_path=lease, fence_grace_s=0.5).start(
        make_launch(["sleep", "300"])
    )
    lease.unlink()
    assert run.wait() == 128 + signal.SIGTERM
    assert (run.fenced() or "").startswith("no readable lease at ")


def test_reap_leftovers_kills_what_an_earlier_agent_left_and_spares_keep(tmp_path: Path) -> None:
    before = launcher(tmp_path / "agent")
    runs = [before.start(make_launch(SLEEPER, job_id=job_id)) for job_id in (1, 2)]
    grandchildren = [int(first_line(run)) for run in runs]
    # The shims die with the earlier agent (say, an OOM kill of the whole tree): only their
    # jobs are left, which no lifeline watches any more.
    for run in runs:
        shim = int((run.attempt_dir / "pid").read_text().split('"shim": ')[1].split(",")[0])
        os.kill(shim, signal.SIGKILL)
    eventually(lambda: all(run.has_exited() for run in runs), within=2)
    assert all(group_members(run.pid or 0) for run in runs)

    after = launcher(tmp_path / "agent")
    assert after.reap_leftovers(keep={(2, 0)}) == [(1, 0)]
    eventually(lambda: not group_members(runs[0].pid or 0), within=1)
    assert not alive(grandchildren[0])
    assert group_members(runs[1].pid or 0) and alive(grandchildren[1])
    assert after.reap_leftovers(keep=set()) == [(2, 0)]
    eventually(lambda: not group_members(runs[1].pid or 0), within=1)
    assert after.reap_leftovers(keep=set()) == []


def test_an_attempt_still_running_is_refused_and_a_dead_one_moved_aside(tmp_path: Path) -> None:
    first = launcher(tmp_path / "agent")
    run = first.start(make_launch(SLEEPER))
    first_line(run)
    with pytest.raises(LaunchError, match="^attempt already running on this node"):
        launcher(tmp_path / "agent").start(make_launch(["true"]))
    run.terminate(0.1)
    run.wait()
    again = launcher(tmp_path / "agent").start(make_launch(["true"]))
    assert again.wait() == 0
    names = sorted(p.name for p in (tmp_path / "agent" / "jobs").iterdir())
    assert names[0] == "1-0" and names[1].startswith("1-0.replaced-")


def test_a_missing_command_is_a_launch_error(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="^command not found: /no/such/program$"):
        launcher(tmp_path).start(make_launch(["/no/such/program"]))


# --- job uids (root agent) --------------------------------------------------------------------


@needs_root
def test_each_running_attempt_gets_its_own_uid_no_groups_and_a_private_directory(
    open_dir: Path,
) -> None:
    python, env = python_for_job_uids()
    code = "import os; print(os.getuid(), os.getgid(), os.getgroups(), flush=True); input()"
    jobs = launcher(open_dir / "agent", job_uids=POOL, network="host")
    runs = [
        jobs.start(make_launch([python, "-c", code], job_id=job_id, env=env)) for job_id in (1, 2)
    ]
    seen = [first_line(run) for run in runs]
    uids = [int(line.split()[0]) for line in seen]
    assert len(set(uids)) == 2 and all(POOL[0] <= uid <= POOL[1] for uid in uids)
    assert seen == [f"{uid} {uid} []" for uid in uids]
    for run, uid in zip(runs, uids, strict=True):
        work = run.attempt_dir / "work"
        assert (work.stat().st_uid, work.stat().st_mode & 0o777) == (uid, 0o700)
        assert (run.attempt_dir / "pid").stat().st_mode & 0o077 == 0
        run.terminate(0.1)
        run.wait()
        run.release()
        assert run.attempt_dir.stat().st_mode & 0o777 == 0o700  # closed once it ended


@needs_root
def test_a_process_that_left_the_jobs_group_dies_with_the_job(open_dir: Path) -> None:
    command = ["sh", "-c", "setsid sleep 300 & echo $!"]
    run = launcher(open_dir / "agent", job_uids=POOL, network="host").start(make_launch(command))
    escaped = int(first_line(run))
    assert run.wait() == 0
    eventually(lambda: not alive(escaped), within=1)


@needs_root
def test_killing_the_agent_also_kills_what_left_the_jobs_group(open_dir: Path) -> None:
    command = ["sh", "-c", "setsid sleep 300 & echo $!; wait"]
    agent, job = start_agent(workdir=open_dir / "agent", command=command, uids=POOL)
    escaped = int(job["line"])
    assert alive(escaped)
    agent.kill()
    agent.wait()
    assert eventually(lambda: not alive(escaped), within=1.0) < 1.0


@needs_root
def test_a_work_directory_job_uids_cannot_reach_is_a_clear_launch_error(tmp_path: Path) -> None:
    # pytest's tmp_path sits in a 0700 directory.
    with pytest.raises(LaunchError, match="cannot reach its work directory: .* is mode 0700"):
        launcher(tmp_path / "agent", job_uids=POOL, network="host").start(make_launch(["true"]))


@needs_root
def test_jobs_are_refused_while_the_portals_files_are_open_to_other_users(
    open_dir: Path,
) -> None:
    database = open_dir / "portal.sqlite3"
    database.write_text("")
    database.chmod(0o644)
    (open_dir / "agent").mkdir(mode=0o700)  # as a umask of 077 leaves it: opened to pass
    jobs = launcher(
        open_dir / "agent" / "node-t", job_uids=POOL, network="host", private_dir=open_dir
    )
    with pytest.raises(LaunchError, match=f"^jobs could open the portal's files: {database};"):
        jobs.start(make_launch(["true"]))
    database.chmod(0o600)
    assert jobs.start(make_launch(["true"])).wait() == 0
    assert (open_dir / "agent").stat().st_mode & 0o777 == 0o701


@needs_root
def test_a_restarted_agent_spares_a_job_another_agent_now_runs_as_a_uid_it_once_used(
    open_dir: Path,
) -> None:
    # Agents sharing a host hand out the same uids. An attempt this agent ran once as uid U
    # ended long ago; another agent's job now runs as U. The restart's sweep of U must not
    # take that job for a leftover (it did: the job died of SIGKILL, reported failed).
    one_uid = (61990, 61990)
    earlier = launcher(open_dir / "a", job_uids=one_uid, network="host")
    ended = earlier.start(make_launch(["true"]))
    assert ended.wait() == 0
    ended.reap()
    ended.release()
    other = launcher(open_dir / "b", job_uids=one_uid, network="host")
    theirs = other.start(make_launch(SLEEPER))
    grandchild = int(first_line(theirs))

    restarted = launcher(open_dir / "a", job_uids=(61990, 61991), network="host")
    assert restarted.reap_leftovers(keep=set()) == []
    again = restarted.start(make_launch(["true"]))  # the same attempt: it is not running
    assert again.wait() == 0
    again.reap()
    again.release()
    assert not theirs.has_exited() and alive(grandchild)
    theirs.terminate(0.1)
    assert theirs.wait() == 128 + signal.SIGTERM
    theirs.release()


@needs_root
def test_a_restarted_agent_kills_what_left_the_group_of_a_job_nobody_watches(
    open_dir: Path,
) -> None:
    command = ["sh", "-c", "setsid sleep 300 & echo $!; wait"]
    agent, job = start_agent(workdir=open_dir / "agent", command=command, uids=(61993, 61993))
    escaped = int(job["line"])
    shim = json.loads((Path(job["attempt_dir"]) / "pid").read_text())["shim"]
    os.kill(shim, signal.SIGKILL)  # the whole agent is killed at once: nobody sweeps
    agent.kill()
    agent.wait()
    assert alive(escaped)
    restarted = launcher(open_dir / "agent", job_uids=(61993, 61993), network="host")
    assert restarted.reap_leftovers(keep=set()) == [(1, 0)]
    eventually(lambda: not alive(escaped), within=1)


@needs_root
def test_a_dead_agents_job_uid_stays_claimed_until_its_shim_has_swept_it(open_dir: Path) -> None:
    uid = 61992
    agent, job = start_agent(workdir=open_dir / "agent", command=SLEEPER, uids=(uid, uid))
    grandchild = int(job["line"])
    shim = json.loads((Path(job["attempt_dir"]) / "pid").read_text())["shim"]
    os.kill(shim, signal.SIGSTOP)  # a shim slow to notice the agent's death
    agent.kill()
    agent.wait()
    try:
        # The agent's claim died with it; the shim's keeps the uid from a new attempt that
        # its sweep would kill.
        assert claim_uid(JobUids.CLAIMS, uid) is None
    finally:
        os.kill(shim, signal.SIGCONT)
    eventually(lambda: not alive(grandchild) and not alive(shim), within=2)
    fd = claim_uid(JobUids.CLAIMS, uid)
    assert fd is not None
    os.close(fd)


# --- what the banner says --------------------------------------------------------------------


def agent_settings(**env: str) -> AgentSettings:
    from workers.signing import key_to_text

    return AgentSettings.from_env({"PORTAL_AGENT_KEY": key_to_text(bytes(range(32))), **env})


@needs_root
def test_the_summary_of_a_root_agent_names_the_uids_and_the_namespace() -> None:
    summary = isolation_summary(agent_settings(PORTAL_AGENT_JOB_CGROUP="off"))
    assert summary.startswith(
        "jobs run as uid 61000-61999 (one per running attempt, no groups) in their own network "
        "namespace (no network); files: private job directories; not isolated: CPU, GPU "
        "memory, /tmp, /dev/shm, world-readable host files; limits per job: rlimits only, "
        "no cgroup (PORTAL_AGENT_JOB_CGROUP=off): RLIMIT_AS "
    )


def test_the_summary_says_plainly_when_jobs_share_the_host_network() -> None:
    summary = isolation_summary(agent_settings(PORTAL_AGENT_JOB_NETWORK="host"))
    assert "with the host network (PORTAL_AGENT_JOB_NETWORK=host)" in summary
    assert "NOT isolated: the network, CPU" in summary


def test_the_summary_says_when_jobs_run_as_the_agents_user() -> None:
    summary = isolation_summary(agent_settings(PORTAL_AGENT_JOB_UIDS="agent"))
    assert summary.startswith(f"jobs run as the agent's user (uid {os.geteuid()})")
    assert "NOT isolated: the agent's files and processes, CPU" in summary


@pytest.mark.parametrize("value", ["0-10", "61000-60000", "abc", "-5", "61000-", "4294967295"])
def test_a_bad_job_uid_range_names_the_variable(value: str) -> None:
    from workers.settings import SettingsError

    with pytest.raises(SettingsError, match="^PORTAL_AGENT_JOB_UIDS: must be a uid range"):
        agent_settings(PORTAL_AGENT_JOB_UIDS=value)


def test_job_uids_accept_a_range_one_uid_or_the_agents_user() -> None:
    assert agent_settings().job_uids == (61000, 61999)
    assert agent_settings(PORTAL_AGENT_JOB_UIDS="70000-70009").job_uids == (70000, 70009)
    assert agent_settings(PORTAL_AGENT_JOB_UIDS="70000").job_uids == (70000, 70000)
    assert agent_settings(PORTAL_AGENT_JOB_UIDS="agent").job_uids is None


def test_a_bad_job_network_names_the_variable_and_the_choices() -> None:
    from workers.settings import SettingsError

    with pytest.raises(SettingsError, match="^PORTAL_AGENT_JOB_NETWORK: must be one of auto, none"):
        agent_settings(PORTAL_AGENT_JOB_NETWORK="bridge")


@pytest.mark.skipif(IS_ROOT, reason="checks the non-root fallback wording")
def test_the_summary_of_a_non_root_agent_says_run_as_root_to_isolate() -> None:
    assert "run the agent as root to isolate" in isolation_summary(agent_settings())


# The agent's end (PDEATHSIG's SIGTERM) landing while the shim starts the job: after the
# job's fork, before the shim knows its pid. Seen in the 1,000-fault chaos run: the shim left
# at once, and the job ran to its end beside its own requeued attempt.
SIGNAL_DURING_SPAWN = """
import json, os, signal, socket, sys, threading, time
from workers import shim

class AgentDiesDuringSpawn(shim.Shim):
    def _spawn(self, request):
        job = super()._spawn(request)
        os.kill(os.getpid(), signal.SIGTERM)  # the agent dies now, the job just started
        time.sleep(0.3)  # the handler runs here, still inside the start
        return job

agent_end, shim_end = socket.socketpair()
args = shim.parse_args([f"--fd={shim_end.fileno()}", f"--attempt-dir={sys.argv[1]}",
                        f"--work-dir={sys.argv[2]}"])
agent_end.sendall(json.dumps({"command": sys.argv[3:], "env": {"PATH": os.environ["PATH"]}})
                  .encode() + b"\\n")
AgentDiesDuringSpawn(args).run()
"""


def test_a_job_started_as_its_agent_dies_is_killed_not_orphaned(tmp_path: Path) -> None:
    attempt_dir, work_dir = tmp_path / "1-0", tmp_path / "1-0" / "work"
    work_dir.mkdir(parents=True)
    pid_file = tmp_path / "job.pid"
    job = ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 300"]
    done = subprocess.run(
        [sys.executable, "-c", SIGNAL_DURING_SPAWN, str(attempt_dir), str(work_dir), *job],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 128 + signal.SIGKILL, done.stderr
    eventually(lambda: pid_file.exists() and pid_file.read_text().strip() != "", within=3)
    job_pid = int(pid_file.read_text())
    assert not alive(job_pid)
    assert read_exit(attempt_dir) == ExitRecord(128 + signal.SIGKILL, True)
    assert read_record(attempt_dir)["pgid"] == job_pid
