"""Process jobs' resource limits and images: real jobs through the launcher and its shim.

Whichever limit this host can enforce is exercised for real (a cgroup v2 per job, or the
rlimits alone); the cgroup path's exact effects are also checked against a fake cgroup2
directory, so they are pinned on a host without cgroup v2 too.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
from pathlib import Path

import msgspec
import pytest
from agent_doubles import RecordingSender, make_launch
from job_processes import (
    IS_ROOT,
    alive,
    eventually,
    first_line,
    launcher,
    needs_root,
    python_for_job_uids,
    supervisor_for,
)

from workers.launch import LaunchError
from workers.launchers.process import isolation_summary
from workers.limits import Cgroups, CgroupUnavailable, JobLimits, kill_cgroup
from workers.protocol import ContainerPolicy, Launch
from workers.settings import AgentSettings, SettingsError
from workers.shim import processes, read_record
from workers.signing import key_to_text

MIB = 1024 * 1024
# A pool of its own: other agents on this host (a chaos run, say) use the default range.
POOL = (62700, 62709)
IMAGE = "python:3.11-slim"  # make_launch's
IMAGE_NOTE = (
    f"[agent] the process launcher ignores the image {IMAGE!r}: the job runs on the host's "
    "filesystem\n"
)
ALLOCATE = "x = bytearray({size}); print('allocated', flush=True)"
# A fork loop that stops at the first refusal, and refuses to start without a limit in place:
# it must never become a fork bomb on a host whose limit was not applied.
FORK_LOOP = """
import os, resource, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
if soft > 64:
    sys.exit(f"no process limit in place (RLIMIT_NPROC {soft}): not forking")
forked = 0
for _ in range(200):
    try:
        pid = os.fork()
    except BlockingIOError as exc:
        print(f"refused after {forked}: {exc.strerror}", flush=True)
        sys.exit(3)
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    forked += 1
print(f"never refused ({forked})", flush=True)
"""


def python_job(code: str, **launch: object) -> Launch:
    python, env = python_for_job_uids()
    return make_launch([python, "-c", code], env=env, **launch)  # type: ignore[arg-type]


def finish(run: object) -> tuple[str, int]:
    output = b"".join(run.output()).decode()  # type: ignore[attr-defined]
    code = run.wait()  # type: ignore[attr-defined]
    run.reap()  # type: ignore[attr-defined]
    run.release()  # type: ignore[attr-defined]
    return output, code


@pytest.fixture
def fake_cgroup2(tmp_path: Path) -> Path:
    """A directory laid out as a cgroup2 mount with every controller: what the agent writes
    there stays as files to read back (the kernel would act on them)."""
    mount = tmp_path / "cgroup"
    mount.mkdir()
    (mount / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (mount / "cgroup.subtree_control").write_text("")
    # The shim returns to its own cgroup after forking the job: this process's, in the fake.
    own = Path("/proc/self/cgroup").read_text().split("0::", 1)[1].splitlines()[0].lstrip("/")
    (mount / own).mkdir(parents=True, exist_ok=True)
    return mount


# --- the limits this host enforces, for real -------------------------------------------------


def test_a_job_over_its_address_space_limit_gets_a_memory_error(open_dir: Path) -> None:
    jobs = launcher(open_dir / "agent", address_space=256 * MIB, limits=JobLimits(nproc=64))
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_AS), flush=True); "
    run = jobs.start(python_job(code + ALLOCATE.format(size=512 * MIB)))
    output, exit_code = finish(run)
    assert exit_code == 1
    assert output.startswith(f"({256 * MIB}, {256 * MIB})\n")
    assert output.rstrip().endswith("MemoryError") and "allocated" not in output
    # The limit was the job's: the agent's own address space is as it was.
    assert resource.getrlimit(resource.RLIMIT_AS) == (resource.RLIM_INFINITY,) * 2


def test_a_job_within_its_memory_limit_runs(open_dir: Path) -> None:
    jobs = launcher(open_dir / "agent", limits=JobLimits(memory_bytes=256 * MIB), cgroup="auto")
    output, exit_code = finish(jobs.start(python_job(ALLOCATE.format(size=64 * MIB))))
    assert (output, exit_code) == ("allocated\n", 0)


@needs_root
def test_a_job_over_its_memory_limit_fails_by_the_limit_this_host_enforces(
    open_dir: Path,
) -> None:
    jobs = launcher(
        open_dir / "agent",
        job_uids=POOL,
        network="host",
        limits=JobLimits(memory_bytes=256 * MIB),
        cgroup="auto",
    )
    run = jobs.start(python_job(ALLOCATE.format(size=768 * MIB)))
    cgroup = run.cgroup
    output, exit_code = finish(run)
    assert "allocated" not in output
    if jobs.limits.cgroups is not None:
        # memory.max (no swap beyond it): the kernel's OOM killer ends the whole job.
        assert exit_code == 137, output
        assert run.end_note.startswith("over its memory limit (256 MiB, cgroup memory.max): the ")
        assert cgroup is not None and not cgroup.exists()
    else:
        # The fallback: RLIMIT_AS at the memory limit refuses the allocation.
        assert jobs.limits.address_space_bytes(jobs.limits.maximum) == 256 * MIB
        assert (exit_code, output.rstrip().splitlines()[-1]) == (1, "MemoryError")
        assert run.end_note == ""


@needs_root
def test_a_fork_loop_stops_at_the_process_limit_and_leaves_the_agent_unharmed(
    open_dir: Path,
) -> None:
    jobs = launcher(
        open_dir / "agent",
        job_uids=POOL,
        network="host",
        limits=JobLimits(nproc=16),
        cgroup="auto",
    )
    run = jobs.start(python_job(FORK_LOOP))
    uid_of_job = read_record(run.attempt_dir)["uid"]
    assert POOL[0] <= uid_of_job <= POOL[1]
    output, exit_code = finish(run)
    assert exit_code == 3, output
    forked = int(output.split("refused after ", 1)[1].split(":")[0])
    assert 0 < forked < 16 and "Resource temporarily unavailable" in output
    # Its children died with it; the agent forks, and the next job runs.
    eventually(lambda: not any(p.uid == uid_of_job for p in processes()), within=2)
    assert subprocess.run(["true"], check=False).returncode == 0
    assert finish(jobs.start(python_job("print('next')", job_id=2))) == ("next\n", 0)


@pytest.mark.skipif(not IS_ROOT, reason="cgroups are the root agent's")
def test_the_whole_cgroup_dies_with_the_job_where_this_host_has_cgroup_v2(
    open_dir: Path,
) -> None:
    # Jobs as the agent's user: no uid sweep, only the cgroup catches what left the group.
    jobs = launcher(open_dir / "agent", limits=JobLimits(nproc=64), cgroup="auto")
    if jobs.limits.cgroups is None:
        pytest.skip(f"no usable cgroup v2 here: {jobs.limits.why_no_cgroup}")
    run = jobs.start(make_launch(["sh", "-c", "setsid sleep 300 & echo $!"]))
    escaped = int(first_line(run))
    assert run.cgroup is not None
    cgroup = run.cgroup
    assert (cgroup / "pids.max").read_text() == "64\n"
    assert run.wait() == 0
    eventually(lambda: not alive(escaped) and not cgroup.exists(), within=5)


# --- the cgroup path's exact effects, on a fake cgroup2 directory -----------------------------


def test_the_cgroup_path_hands_the_controllers_down_writes_the_limits_and_moves_the_job_in(
    open_dir: Path, fake_cgroup2: Path
) -> None:
    jobs = launcher(
        open_dir / "agent",
        limits=JobLimits(memory_bytes=256 * MIB, nproc=64, cpus=1.5),
        cgroup="require",
        cgroup_mount=fake_cgroup2,
    )
    root = fake_cgroup2 / "portal-agent"
    assert jobs.limits.cgroups == Cgroups(mount=fake_cgroup2, root=root)
    assert jobs.limits.controllers == {"memory", "pids", "cpu"}
    run = jobs.start(python_job("import os; print(os.getppid(), flush=True)"))
    shim = int(first_line(run))
    assert run.wait() == 0
    cgroup = run.cgroup
    assert cgroup is not None and cgroup.parent == root
    assert cgroup.name.startswith("agent.") and cgroup.name.endswith("-1-0")
    for handed_down in (fake_cgroup2, root):
        assert (handed_down / "cgroup.subtree_control").read_text() == "+memory +pids +cpu\n"
    assert {p.name: p.read_text() for p in cgroup.iterdir()} == {
        "memory.max": f"{256 * MIB}\n",
        "pids.max": "64\n",
        "cpu.max": "150000 100000\n",
        # The shim moved itself in to fork the job there ...
        "cgroup.procs": f"{shim}\n",
    }
    # ... and back to where it came from.
    own = Path("/proc/self/cgroup").read_text().split("0::", 1)[1].splitlines()[0].lstrip("/")
    assert (fake_cgroup2 / own / "cgroup.procs").read_text() == f"{shim}\n"
    # No RLIMIT_AS beside a cgroup (CUDA reserves far more address space than it uses).
    assert jobs.limits.address_space_bytes(jobs.limits.maximum) is None


def test_the_oom_killers_count_in_the_jobs_cgroup_is_reported_with_the_exit(
    open_dir: Path, fake_cgroup2: Path
) -> None:
    # Here the job plays the kernel: it writes its cgroup's memory.events, as the OOM killer's
    # count would read once the kernel killed one of its processes.
    jobs = launcher(
        open_dir / "agent",
        limits=JobLimits(memory_bytes=256 * MIB),
        cgroup="require",
        cgroup_mount=fake_cgroup2,
    )
    events = jobs.cgroup_of((1, 0))
    assert events is not None
    code = f"open({str(events / 'memory.events')!r}, 'w').write('oom 1\\noom_kill 2\\n')"
    run = jobs.start(make_launch(["python3", "-c", code]))
    assert run.wait() == 0
    assert run.end_note == (
        "over its memory limit (256 MiB, cgroup memory.max): the kernel's OOM killer ended 2 "
        "processes of the job"
    )


def test_killing_a_cgroup_writes_cgroup_kill_and_waits_until_it_is_empty(tmp_path: Path) -> None:
    cgroup = tmp_path / "job"
    cgroup.mkdir()
    (cgroup / "cgroup.kill").write_text("")
    (cgroup / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    kill_cgroup(cgroup, within=1)
    assert (cgroup / "cgroup.kill").read_text() == "1\n"


def test_a_cgroup2_without_the_memory_controller_is_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    mount = tmp_path / "unified"
    mount.mkdir()
    (mount / "cgroup.controllers").write_text("hugetlb\n")
    with pytest.raises(CgroupUnavailable, match=r"has no memory, pids controller"):
        Cgroups(mount=mount, root=mount / "portal-agent").probe(JobLimits())
    with pytest.raises(SettingsError, match="^PORTAL_AGENT_JOB_CGROUP: require was asked for"):
        launcher(tmp_path / "agent", cgroup="require", cgroup_mount=mount)
    fallback = launcher(tmp_path / "agent", cgroup="auto", cgroup_mount=mount)
    assert fallback.limits.cgroups is None
    assert "has no memory, pids controller" in fallback.limits.why_no_cgroup


# --- what the banner says ---------------------------------------------------------------------


def test_the_banner_names_the_cgroup_root_and_its_limits(
    tmp_path: Path, fake_cgroup2: Path
) -> None:
    jobs = launcher(
        tmp_path / "agent",
        limits=JobLimits(memory_bytes=2048 * MIB, nproc=512, cpus=4),
        cgroup="auto",
        cgroup_mount=fake_cgroup2,
    )
    assert jobs.limits.summary() == (
        f"limits per job: cgroup v2 under {fake_cgroup2 / 'portal-agent'} (memory.max 2 GiB, "
        "pids.max 512, cpu.max 4 CPUs), "
        + (
            "RLIMIT_NPROC not applied (jobs run as root, which it does not bind)"
            if IS_ROOT
            else "RLIMIT_NPROC 512 tasks more than the agent's user runs (shared with the "
            "agent's processes: no job uids without root)"
        )
    )
    # CPU and memory are bounded now: no longer listed among what jobs share unbounded.
    assert "and processes, GPU memory, /tmp, /dev/shm" in jobs.isolation.summary()


@needs_root
def test_the_banner_says_when_only_rlimits_bound_a_job() -> None:
    settings = AgentSettings.from_env(
        {
            "PORTAL_AGENT_KEY": key_to_text(bytes(range(32))),
            "PORTAL_AGENT_JOB_CGROUP": "off",
            "PORTAL_AGENT_JOB_MEMORY_MB": "1024",
            "PORTAL_AGENT_JOB_NPROC": "256",
            "PORTAL_AGENT_JOB_NETWORK": "host",
        }
    )
    assert isolation_summary(settings).endswith(
        "NOT isolated: the network, CPU, GPU memory, /tmp, /dev/shm, world-readable host "
        "files; limits per job: rlimits only, no cgroup (PORTAL_AGENT_JOB_CGROUP=off): "
        "RLIMIT_AS 1 GiB (address space, not memory used), RLIMIT_NPROC 256 tasks of the "
        "job's own uid; CPU not limited"
    )


# --- settings -------------------------------------------------------------------------------


def agent_settings(**env: str) -> AgentSettings:
    return AgentSettings.from_env({"PORTAL_AGENT_KEY": key_to_text(bytes(range(32))), **env})


def test_the_limits_default_to_three_quarters_of_the_hosts_memory_and_4096_tasks() -> None:
    settings = agent_settings()
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert settings.job_limits.memory_bytes is not None
    assert abs(settings.job_limits.memory_bytes - physical * 3 // 4) <= MIB
    assert (settings.job_limits.nproc, settings.job_limits.cpus) == (4096, None)
    assert (settings.job_address_space, settings.job_cgroup) == ("auto", "auto")
    assert (settings.process_images, settings.process_host_images) == ("note", ())


def test_the_limits_settings_read_their_values() -> None:
    settings = agent_settings(
        PORTAL_AGENT_JOB_MEMORY_MB="512",
        PORTAL_AGENT_JOB_NPROC="max",
        PORTAL_AGENT_JOB_CPUS="2.5",
        PORTAL_AGENT_JOB_ADDRESS_SPACE_MB="max",
        PORTAL_AGENT_JOB_CGROUP="require",
        PORTAL_AGENT_JOB_CGROUP_ROOT="/sys/fs/cgroup/agents.slice/portal",
        PORTAL_AGENT_PROCESS_IMAGES="refuse",
        PORTAL_AGENT_PROCESS_HOST_IMAGES="host, local/host:1",
    )
    assert settings.job_limits == JobLimits(memory_bytes=512 * MIB, nproc=None, cpus=2.5)
    assert settings.job_address_space == "max"
    assert settings.job_cgroup == "require"
    assert settings.job_cgroup_root == Path("/sys/fs/cgroup/agents.slice/portal")
    assert settings.process_images == "refuse"
    assert settings.process_host_images == ("host", "local/host:1")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PORTAL_AGENT_JOB_MEMORY_MB", "32", "must be a number of MiB, at least 64, or max"),
        ("PORTAL_AGENT_JOB_MEMORY_MB", "1G", "must be a number of MiB, at least 64, or max"),
        ("PORTAL_AGENT_JOB_ADDRESS_SPACE_MB", "lots", "must be auto, max or a number of MiB"),
        ("PORTAL_AGENT_JOB_NPROC", "0", "must be a positive whole number or max"),
        ("PORTAL_AGENT_JOB_CPUS", "-1", "must be a number of CPUs (e.g. 2 or 0.5) or max"),
        ("PORTAL_AGENT_JOB_CGROUP", "v1", "must be one of auto, require, off"),
        ("PORTAL_AGENT_JOB_CGROUP_ROOT", "portal", "must be an absolute path"),
        ("PORTAL_AGENT_PROCESS_IMAGES", "ignore", "must be one of note, refuse"),
    ],
)
def test_a_bad_limits_setting_names_the_variable_and_what_it_accepts(
    name: str, value: str, message: str
) -> None:
    with pytest.raises(SettingsError, match=f"^{name}: {re.escape(message)}"):
        agent_settings(**{name: value})


# --- images and the portal's policy, through the supervisor ------------------------------------


def test_the_log_says_first_that_the_image_was_not_used(
    tmp_path: Path, sender: RecordingSender
) -> None:
    supervisor = supervisor_for(launcher(tmp_path / "agent"), sender, tmp_path / "attempts")
    supervisor.launch(make_launch(["python3", "-c", "print('hello')"]))
    assert sender.finished().outcome == "succeeded"
    assert sender.log_text() == IMAGE_NOTE + "hello\n"
    supervisor.shutdown(grace_s=0.5)


def test_an_image_the_operator_calls_the_host_gets_no_note(
    tmp_path: Path, sender: RecordingSender
) -> None:
    jobs = launcher(tmp_path / "agent", images="refuse", host_images=("host",))
    supervisor = supervisor_for(jobs, sender, tmp_path / "attempts")
    launch = msgspec.structs.replace(make_launch(["python3", "-c", "print('hello')"]), image="host")
    supervisor.launch(launch)
    assert sender.finished().outcome == "succeeded"
    assert sender.log_text() == "hello\n"
    supervisor.shutdown(grace_s=0.5)


def test_refuse_mode_refuses_an_image_it_cannot_honour_and_names_the_setting(
    tmp_path: Path, sender: RecordingSender
) -> None:
    marker = tmp_path / "ran"
    jobs = launcher(tmp_path / "agent", images="refuse", host_images=("host",))
    with pytest.raises(LaunchError):
        jobs.start(make_launch(["touch", str(marker)]))
    supervisor = supervisor_for(jobs, sender, tmp_path / "attempts")
    supervisor.launch(make_launch(["touch", str(marker)], job_id=2))
    finished = sender.finished(2)
    assert (finished.outcome, finished.exit_code) == ("launch_error", None)
    assert finished.error == (
        f"the process launcher cannot run the image {IMAGE!r} (it runs jobs on the host's "
        "filesystem) and this node refuses such jobs (PORTAL_AGENT_PROCESS_IMAGES=refuse); "
        "run the job on a node with the docker launcher, or use the image 'host' (this "
        "host's own filesystem)"
    )
    assert not marker.exists()
    supervisor.shutdown(grace_s=0.5)


def test_a_job_asking_more_than_the_node_allows_gets_the_nodes_limit_and_is_told(
    tmp_path: Path, sender: RecordingSender
) -> None:
    jobs = launcher(
        tmp_path / "agent",
        limits=JobLimits(memory_bytes=512 * MIB, nproc=128),
        host_images=(IMAGE,),
    )
    supervisor = supervisor_for(jobs, sender, tmp_path / "attempts")
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0] // 2**20)"
    policy = ContainerPolicy(memory_mb=4096, pids_limit=64)
    supervisor.launch(msgspec.structs.replace(make_launch(["python3", "-c", code]), policy=policy))
    assert sender.finished().outcome == "succeeded"
    assert sender.log_text() == (
        "[agent] the job asked for memory 4 GiB; process jobs on this node get at most "
        "512 MiB (PORTAL_AGENT_JOB_MEMORY_MB)\n512\n"
    )
    supervisor.shutdown(grace_s=0.5)


def test_a_job_asking_less_than_the_node_allows_gets_what_it_asked(tmp_path: Path) -> None:
    jobs = launcher(tmp_path / "agent", limits=JobLimits(memory_bytes=512 * MIB, nproc=128))
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0] // 2**20)"
    launch = msgspec.structs.replace(
        make_launch(["python3", "-c", code]), policy=ContainerPolicy(memory_mb=256)
    )
    run = jobs.start(launch)
    assert run.notes == (IMAGE_NOTE,)
    assert finish(run) == ("256\n", 0)
