"""The Docker launcher against a real Docker engine that the test starts itself.

Skipped unless the tests run as root. Without `dockerd` (Debian's docker.io, which `make test`
installs when root) skipped too, or failed when PORTAL_REQUIRE_SERVICES=1, as in CI. The engine
runs with the vfs storage driver and no networking; the image is imported from a tarball of the
host's /bin/sh and /bin/sleep with their libraries (no registry). There is no NVIDIA runtime here,
so a real launch must fail at the GPU device request and leave no container behind; the
container lifecycle (logs, exit code, stop with grace, removal), adoption by a restarted
agent and the watchdog's fencing are exercised with the launcher itself on a client that drops
that device request. The container policy is checked as the engine applies it: the real
HostConfig, and jobs that try to write outside /scratch, fork past their pids limit or go
over their memory. Each test that needs a clean slate uses a node name of its own.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from agent_doubles import GPU_0, RecordingSender, make_launch
from services import require_service

from workers.agent import build_launcher
from workers.launchers.docker import DockerLauncher
from workers.lease import Lease, lease_path, write_lease
from workers.outbox import AttemptJournal
from workers.policy import HostPolicy
from workers.protocol import ContainerPolicy, Launch, Started, Stop
from workers.settings import AgentSettings
from workers.signing import KEY_BYTES, key_to_text
from workers.supervisor import Supervisor
from workers.watchdog import ensure_watchdog, process_identity

docker = pytest.importorskip("docker")
DOCKERD = shutil.which("dockerd")
IMAGE = "portal-agent-test:1"


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The started engine's URL (what `DOCKER_HOST` would hold)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start an engine")
    if DOCKERD is None:
        # `make test` installs it when root (scripts/ensure-dockerd.sh); CI must run these.
        require_service("dockerd (Debian's docker.io package)")
    root = tmp_path_factory.mktemp("dockerd")
    socket = root / "docker.sock"
    log = (root / "dockerd.log").open("w")
    daemon = subprocess.Popen(
        [
            str(DOCKERD),
            "--storage-driver=vfs",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            f"--data-root={root / 'data'}",
            f"--exec-root={root / 'exec'}",
            f"--pidfile={root / 'dockerd.pid'}",
            f"--host=unix://{socket}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = docker.DockerClient(base_url=f"unix://{socket}", version="1.41")
    try:
        wait_for_engine(client, daemon, root)
        client.api.import_image_from_data(minimal_rootfs(), repository=IMAGE.split(":")[0], tag="1")
        yield f"unix://{socket}"
    finally:
        client.close()
        daemon.terminate()
        daemon.wait(30)
        log.close()


@pytest.fixture(scope="module")
def engine(engine_url: str) -> Iterator[Any]:
    client = docker.DockerClient(base_url=engine_url, version="1.41")
    yield client
    client.close()


def wait_for_engine(client: Any, daemon: subprocess.Popen[bytes], root: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            client.ping()
            return
        except Exception:
            if time.monotonic() > deadline or daemon.poll() is not None:
                require_service(
                    f"a dockerd that starts ({(root / 'dockerd.log').read_text()[-500:]})"
                )
            time.sleep(0.2)


def minimal_rootfs() -> bytes:
    """A tarball with /bin/sh, /bin/sleep and the shared libraries they load, and a /tmp that
    everyone may write (so only a read-only root filesystem stops a job writing there)."""
    binaries = ["/bin/sh", "/bin/sleep"]
    ldd = subprocess.run(["ldd", *binaries], capture_output=True, text=True, check=True).stdout
    # ldd prints "/bin/sh:" headers, then "libc.so.6 => /lib/.../libc.so.6 (0x...)" lines.
    libraries = {w for w in ldd.split() if w.startswith("/") and not w.endswith(":")}
    files = sorted({*binaries, *libraries})
    # Every directory on the way, readable by all: jobs do not run as root.
    folders = sorted({str(parent) for f in files for parent in Path(f).parents} - {"/"})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for folder in folders:
            entry = tarfile.TarInfo(folder.lstrip("/"))
            entry.type, entry.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(entry)
        for path in files:
            data = Path(path).read_bytes()  # follows symlinks: the file itself goes in
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        tmp = tarfile.TarInfo("tmp")
        tmp.type, tmp.mode = tarfile.DIRTYPE, 0o1777
        tar.addfile(tmp)
    return buffer.getvalue()


def containers_of(client: Any, launch: Launch) -> list[Any]:
    label = f"portal.job_id={launch.job_id}"
    return client.containers.list(all=True, filters={"label": label})


def supervisor_for(launcher: Any, sender: RecordingSender, tmp_path: Path) -> Supervisor:
    def report(message: Any) -> bool:
        sender(message)
        return True

    journal = AttemptJournal(tmp_path / "journal")
    return Supervisor(node="n1", launcher=launcher, report=report, journal=journal)


def test_without_an_nvidia_runtime_a_launch_fails_cleanly(engine: Any, tmp_path: Path) -> None:
    sender = RecordingSender()
    launcher = DockerLauncher(node="n1", mps_root=tmp_path, client=engine, workdir=tmp_path)
    supervisor = supervisor_for(launcher, sender, tmp_path)
    launch = msgspec.structs.replace(make_launch(["sh", "-c", "echo hi"], job_id=901), image=IMAGE)
    supervisor.launch(launch)
    finished = sender.finished(901)
    assert (finished.outcome, finished.exit_code) == ("launch_error", None)
    assert "nvidia" in finished.error  # the engine refused exactly the GPU device request
    assert sender.of_type(Started) == []
    assert containers_of(engine, launch) == []
    assert list((tmp_path / "scratch").iterdir()) == []  # its scratch went with it


class WithoutGpus:
    """An engine client that drops the GPU device request this engine lacks (no NVIDIA
    runtime here); everything else goes to the engine as the launcher built it."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.images = client.images
        self.containers = self

    def create(self, **kwargs: Any) -> Any:
        del kwargs["device_requests"]
        return self._client.containers.create(**kwargs)

    def list(self, **kwargs: Any) -> Any:
        return self._client.containers.list(**kwargs)


# Larger than any policy these tests ask for, and within what any test host has.
TEST_HOST = HostPolicy(memory_mb_max=1024, cpus_max=1.0, pids_limit_max=256)


class EngineWithoutGpus(DockerLauncher):
    """The Docker launcher itself, on the agent's work directory `<mps_root>/agent`, minus the
    GPU device request."""

    name = "docker-without-gpus"

    def __init__(
        self, client: Any, mps_root: Path, node: str = "n1", policy: HostPolicy = TEST_HOST
    ) -> None:
        super().__init__(
            node=node,
            mps_root=mps_root,
            workdir=mps_root / "agent",
            client=WithoutGpus(client),
            policy=policy,
        )


def engine_launch(command: list[str], job_id: int) -> Launch:
    launch = make_launch(command, job_id=job_id, env={"GREETING": "hello"})
    return msgspec.structs.replace(launch, image=IMAGE)


def test_a_container_ships_its_log_and_exit_code_and_is_removed(
    engine: Any, tmp_path: Path
) -> None:
    sender = RecordingSender()
    supervisor = supervisor_for(EngineWithoutGpus(engine, tmp_path), sender, tmp_path)
    launch = engine_launch(["sh", "-c", 'echo "$GREETING $CUDA_VISIBLE_DEVICES"; exit 3'], 902)
    supervisor.launch(launch)
    finished = sender.finished(902, timeout=60)
    assert (finished.outcome, finished.exit_code) == ("failed", 3)
    assert sender.log_text(902) == f"hello {GPU_0}\n"
    assert sender.started(902).container_id
    assert containers_of(engine, launch) == []


def test_a_stopped_container_is_killed_after_the_grace_and_reported_cancelled(
    engine: Any, tmp_path: Path
) -> None:
    sender = RecordingSender()
    supervisor = supervisor_for(EngineWithoutGpus(engine, tmp_path), sender, tmp_path)
    launch = engine_launch(["sh", "-c", "echo up; sleep 60"], 903)
    supervisor.launch(launch)
    sender.wait_for(lambda m: getattr(m, "data", "") == "up\n", timeout=60)
    supervisor.stop(Stop(node=launch.node, job_id=903, attempt=0, reason="cancel", grace_s=1.0))
    finished = sender.finished(903, timeout=60)
    # sh as PID 1 ignores SIGTERM, so `docker stop` kills it when the grace runs out.
    assert (finished.outcome, finished.exit_code) == ("cancelled", 137)
    assert containers_of(engine, launch) == []


# --- the container policy, as the engine applies it -----------------------------------------


def confined(launch: Launch, **policy: Any) -> Launch:
    return msgspec.structs.replace(launch, policy=ContainerPolicy(**policy))


def run_to_end(
    launcher: DockerLauncher, engine: Any, launch: Launch
) -> tuple[int, str, dict[str, Any]]:
    """(exit code, output, the engine's inspect of the container) of a launch run to its end;
    the container is removed afterwards."""
    run = launcher.start(launch)
    try:
        code = run.wait()
        output = b"".join(run.output()).decode()
        return code, output, engine.api.inspect_container(run.container_id)
    finally:
        run.release()


HOST_CONFIG_SHOWN = (
    "CapAdd",
    "CapDrop",
    "SecurityOpt",
    "Privileged",
    "PidsLimit",
    "Memory",
    "MemorySwap",
    "NanoCpus",
    "NetworkMode",
    "ReadonlyRootfs",
    "IpcMode",
    "Binds",
    "Mounts",
    "Tmpfs",
    "Devices",
    "DeviceRequests",
)
# The job reads its own credentials and sees its network interfaces (sh builtins only: the
# image has nothing but sh and sleep).
SHOW_SELF = (
    "while read k v; do case $k in Uid:|Gid:|CapEff:|CapBnd:|NoNewPrivs:) echo $k $v;; esac; "
    "done < /proc/self/status; while read l; do echo net $l; done < /proc/net/dev"
)


def test_the_engine_runs_the_container_exactly_as_the_policy_says(
    engine: Any, tmp_path: Path
) -> None:
    launcher = EngineWithoutGpus(engine, tmp_path, node="policy-1")
    launch = confined(
        engine_launch(["sh", "-c", SHOW_SELF], 940),
        memory_mb=256,
        cpus=0.5,
        pids_limit=64,
        read_only_rootfs=True,
    )
    scratch = tmp_path / "agent" / "scratch" / "940-0"
    code, output, inspected = run_to_end(launcher, engine, launch)
    host_config = inspected["HostConfig"]
    # The closing note shows this: the HostConfig as inspected from the engine.
    shown = {key: host_config.get(key) for key in HOST_CONFIG_SHOWN}
    mounts = inspected["Mounts"]
    print(json.dumps({"User": inspected["Config"]["User"], "HostConfig": shown, "Mounts": mounts}))
    assert code == 0
    assert inspected["Config"]["User"] == "65534:65534"  # the image names no user
    assert host_config["CapDrop"] == ["ALL"] and not host_config["CapAdd"]
    assert host_config["SecurityOpt"] == ["no-new-privileges"]
    assert host_config["Privileged"] is False
    assert host_config["PidsLimit"] == 64
    assert host_config["Memory"] == host_config["MemorySwap"] == 256 * 1024 * 1024
    assert host_config["NanoCpus"] == 500_000_000
    assert host_config["NetworkMode"] == "none"
    assert host_config["ReadonlyRootfs"] is True
    assert host_config["IpcMode"] != "host"
    # No host path but the job's own scratch.
    assert host_config["Binds"] == [f"{scratch}:/scratch:rw"]
    assert [(m["Type"], m["Source"], m["Destination"], m["RW"]) for m in inspected["Mounts"]] == [
        ("bind", str(scratch), "/scratch", True)
    ]
    # And what the job itself sees: not root, no capability, no new privileges, only loopback.
    assert "Uid: 65534 65534 65534 65534" in output
    assert "Gid: 65534 65534 65534 65534" in output
    assert "CapEff: 0000000000000000" in output and "CapBnd: 0000000000000000" in output
    assert "NoNewPrivs: 1" in output
    interfaces = [line.split()[1] for line in output.splitlines() if line.startswith("net ")]
    assert [i for i in interfaces if i.endswith(":")] == ["lo:"]


def test_a_job_cannot_write_outside_scratch_on_a_read_only_root_filesystem(
    engine: Any, tmp_path: Path
) -> None:
    script = (
        "echo x > /tmp/x; echo tmp=$?; echo y > /scratch/y; echo scratch=$?; "
        "read got < /scratch/y; echo read=$got"
    )
    launcher = EngineWithoutGpus(engine, tmp_path, node="policy-2")
    read_only = confined(engine_launch(["sh", "-c", script], 941), read_only_rootfs=True)
    code, output, _ = run_to_end(launcher, engine, read_only)
    assert "Read-only file system" in output
    assert "tmp=2" in output  # the redirection failed
    assert "scratch=0" in output and "read=y" in output
    assert code == 0
    # The same job with a writable root filesystem does write /tmp: the read-only one stopped it.
    code, output, _ = run_to_end(
        launcher, engine, confined(engine_launch(["sh", "-c", script], 942))
    )
    assert "tmp=0" in output and "Read-only" not in output


def test_a_fork_bomb_stops_at_the_pids_limit(engine: Any, tmp_path: Path) -> None:
    script = "i=0; while [ $i -lt 100 ]; do sleep 30 & i=$((i+1)); done; echo all-forked"
    launcher = EngineWithoutGpus(engine, tmp_path, node="policy-3")
    launch = confined(engine_launch(["sh", "-c", script], 943), pids_limit=16)
    started = time.monotonic()
    code, output, inspected = run_to_end(launcher, engine, launch)
    assert inspected["HostConfig"]["PidsLimit"] == 16
    assert "Cannot fork" in output
    assert "all-forked" not in output
    assert code != 0
    assert time.monotonic() - started < 25  # it ended at the failed fork, not after the sleeps


def test_a_job_over_its_memory_limit_is_killed_137_and_reported_oom_killed(
    engine: Any, tmp_path: Path
) -> None:
    sender = RecordingSender()
    launcher = EngineWithoutGpus(engine, tmp_path, node="policy-4")
    supervisor = supervisor_for(launcher, sender, tmp_path)
    grow = "echo growing; x=0123456789; while :; do x=$x$x; done"
    supervisor.launch(confined(engine_launch(["sh", "-c", grow], 944), memory_mb=32))
    finished = sender.finished(944, timeout=120)
    assert (finished.outcome, finished.exit_code) == ("failed", 137)
    assert finished.error == (
        "exit code 137 (killed by SIGKILL); "
        "OOM_KILLED: the job went over its memory limit of 32 MiB and the kernel killed it"
    )
    assert sender.log_text(944) == "growing\n"
    assert list((tmp_path / "agent" / "scratch").iterdir()) == []


def test_a_launch_outside_the_hosts_policy_never_reaches_the_engine(
    engine: Any, tmp_path: Path
) -> None:
    sender = RecordingSender()
    host = HostPolicy(memory_mb_max=64, cpus_max=1.0, image_prefixes=(IMAGE.split(":")[0],))
    supervisor = supervisor_for(
        EngineWithoutGpus(engine, tmp_path, "policy-5", host), sender, tmp_path
    )
    outside = msgspec.structs.replace(
        engine_launch(["sh", "-c", "echo never"], 945), image="registry.internal/other:1"
    )
    too_big = confined(engine_launch(["sh", "-c", "echo never"], 946), memory_mb=65)
    supervisor.launch(outside)
    supervisor.launch(too_big)
    assert "is not allowed on this host" in sender.finished(945).error
    assert sender.finished(946).error.startswith("container policy refused")
    assert containers_of(engine, outside) == [] and containers_of(engine, too_big) == []


# --- adoption after an agent restart --------------------------------------------------------


def restarted_launcher(engine: Any, tmp_path: Path, node: str) -> DockerLauncher:
    """What a restarted agent builds: a fresh launcher on the same engine and work directory."""
    return DockerLauncher(
        node=node, mps_root=tmp_path, client=engine, workdir=tmp_path / "agent", policy=TEST_HOST
    )


# stdout and stderr, a line written in two pieces, a line longer than the engine's 16 KiB log
# buffer, then more output after the restart.
MIXED_OUTPUT = (
    "echo one; echo err >&2; printf 'half '; sleep 0.3; echo line; "
    "i=0; while [ $i -lt 2000 ]; do printf 0123456789; i=$((i+1)); done; echo; "
    "sleep 2; echo two; exit 5"
)


def test_a_restarted_agent_adopts_a_running_container_and_reads_the_same_chunks_again(
    engine: Any, tmp_path: Path
) -> None:
    launch = engine_launch(["sh", "-c", MIXED_OUTPUT], 910)
    first = EngineWithoutGpus(engine, tmp_path, node="adopt-1").start(launch)
    live: list[bytes] = []
    for chunk in first.output():  # what the old agent read and shipped before it died
        live.append(chunk)
        if b"".join(live).endswith(b"89\n"):
            break

    adopted = restarted_launcher(engine, tmp_path, "adopt-1").adopt()

    assert list(adopted) == [(910, 0)]
    run = adopted[(910, 0)]
    assert (run.container_id, run.fenced()) == (first.container_id, None)
    assert not run.has_exited()
    # The engine hands the same bytes back: a restarted agent goes on from the byte its
    # journal says was shipped (here: all the old agent read).
    shipped = len(b"".join(live))
    assert b"".join(run.output(shipped)) == b"two\n"
    assert b"".join(run.output()) == b"".join(live) + b"two\n"
    # stdout and stderr race into the log, but once logged their order is fixed.
    assert sorted(b"".join(live).splitlines()) == [
        b"0123456789" * 2000,
        b"err",
        b"half line",
        b"one",
    ]
    assert run.wait() == 5
    scratch = tmp_path / "agent" / "scratch" / "910-0"
    assert scratch.is_dir()  # the adopted run keeps its scratch until it is released
    run.release()
    assert containers_of(engine, launch) == []
    assert not scratch.exists()


def test_an_attempt_that_ended_while_no_agent_watched_is_adopted_with_its_exit_code(
    engine: Any, tmp_path: Path
) -> None:
    launch = engine_launch(["sh", "-c", "echo done; exit 7"], 911)
    first = EngineWithoutGpus(engine, tmp_path, node="adopt-2").start(launch)
    first.wait()  # it ends; the agent that started it is gone and never read its output

    adopted = restarted_launcher(engine, tmp_path, "adopt-2").adopt()

    run = adopted[(911, 0)]
    assert run.has_exited()
    assert run.wait() == 7
    assert b"".join(run.output()) == b"done\n"
    assert run.fenced() is None
    run.release()
    assert containers_of(engine, launch) == []


def test_adoption_removes_a_container_that_was_created_but_never_started(
    engine: Any, tmp_path: Path
) -> None:
    launch = engine_launch(["sh", "-c", "echo never"], 912)
    EngineWithoutGpus(engine, tmp_path, node="adopt-3").create(launch)  # the agent died here
    scratch = tmp_path / "agent" / "scratch" / "912-0"
    assert scratch.is_dir()

    assert restarted_launcher(engine, tmp_path, "adopt-3").adopt() == {}
    assert containers_of(engine, launch) == []
    assert not scratch.exists()


def test_adoption_finds_only_its_own_nodes_containers(engine: Any, tmp_path: Path) -> None:
    ours = EngineWithoutGpus(engine, tmp_path, node="adopt-4").start(
        engine_launch(["sh", "-c", "exit 0"], 913)
    )
    theirs = EngineWithoutGpus(engine, tmp_path, node="adopt-5").start(
        engine_launch(["sh", "-c", "exit 0"], 914)
    )
    try:
        adopted = restarted_launcher(engine, tmp_path, "adopt-4").adopt()
        assert {k: r.container_id for k, r in adopted.items()} == {(913, 0): ours.container_id}
    finally:
        ours.release()
        theirs.release()


# --- the watchdog ---------------------------------------------------------------------------


@pytest.fixture
def watchdogs() -> Iterator[list[int]]:
    """Pids of the watchdogs a test started; any still running are killed afterwards."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if process_identity(pid) is not None:
            os.kill(pid, signal.SIGKILL)


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def engine_time(value: str) -> float:
    """The engine's RFC 3339 time with nanoseconds (`...:05.123456789Z`) as epoch seconds."""
    head, _, fraction = value.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(fraction or '0')[:6]}+00:00").timestamp()


def state_of(engine: Any, container_id: str | None) -> dict[str, Any]:
    return engine.api.inspect_container(container_id)["State"]  # type: ignore[no-any-return]


def test_the_watchdog_kills_a_running_container_once_the_lease_lapses_and_says_why(
    engine: Any, engine_url: str, tmp_path: Path, watchdogs: list[int]
) -> None:
    workdir = tmp_path / "agent"
    valid_until = time.time() + 1.0
    write_lease(lease_path(workdir), Lease(valid_until=valid_until, boot="boot-1"))
    run = EngineWithoutGpus(engine, tmp_path, node="fence-1").start(
        engine_launch(["sleep", "60"], 920)
    )
    watchdogs.append(ensure_watchdog(workdir=workdir, node="fence-1", docker_host=engine_url))

    wait_until(lambda: state_of(engine, run.container_id)["Status"] == "exited")

    state = state_of(engine, run.container_id)
    assert state["ExitCode"] == 137  # SIGKILL
    assert engine_time(state["FinishedAt"]) >= valid_until  # not before the lease lapsed
    launcher = restarted_launcher(engine, tmp_path, "fence-1")
    reason = launcher.fenced(920, 0)
    assert reason is not None
    assert "lease (boot boot-1) lapsed" in reason and "watchdog killed" in reason
    assert launcher.fenced(920, 1) is None
    # Not removed: the agent still learns the exit code, and that the attempt was fenced.
    adopted = launcher.adopt()[(920, 0)]
    assert (adopted.has_exited(), adopted.wait(), adopted.fenced()) == (True, 137, reason)
    adopted.release()
    assert launcher.fenced(920, 0) is None


def test_the_watchdog_leaves_containers_alone_while_the_lease_is_renewed(
    engine: Any, engine_url: str, tmp_path: Path, watchdogs: list[int]
) -> None:
    workdir = tmp_path / "agent"
    write_lease(lease_path(workdir), Lease(valid_until=time.time() + 1.0, boot="boot-1"))
    run = EngineWithoutGpus(engine, tmp_path, node="fence-2").start(
        engine_launch(["sleep", "60"], 921)
    )
    watchdogs.append(ensure_watchdog(workdir=workdir, node="fence-2", docker_host=engine_url))

    renew_until = time.monotonic() + 3.0  # three times the lease
    while time.monotonic() < renew_until:
        write_lease(lease_path(workdir), Lease(valid_until=time.time() + 1.0, boot="boot-1"))
        time.sleep(0.25)

    assert state_of(engine, run.container_id)["Status"] == "running"
    assert restarted_launcher(engine, tmp_path, "fence-2").fenced(921, 0) is None
    run.release()


def test_a_dead_agents_container_runs_until_the_lease_lapses_then_the_watchdog_exits(
    engine: Any, engine_url: str, tmp_path: Path, watchdogs: list[int]
) -> None:
    workdir = tmp_path / "agent"
    dead_agent = subprocess.Popen(["true"])
    dead_agent.wait()
    valid_until = time.time() + 2.0
    write_lease(lease_path(workdir), Lease(valid_until=valid_until, boot="boot-1"))
    run = EngineWithoutGpus(engine, tmp_path, node="fence-3").start(
        engine_launch(["sleep", "60"], 922)
    )
    pid = ensure_watchdog(
        workdir=workdir, node="fence-3", agent_pid=dead_agent.pid, docker_host=engine_url
    )
    watchdogs.append(pid)

    wait_until(lambda: process_identity(pid) is None)  # it stood down: nothing left to guard

    state = state_of(engine, run.container_id)
    assert (state["Status"], state["ExitCode"]) == ("exited", 137)
    assert engine_time(state["FinishedAt"]) >= valid_until
    assert restarted_launcher(engine, tmp_path, "fence-3").fenced(922, 0) is not None
    assert not (workdir / "watchdog.pid").exists()
    run.release()


def test_a_watchdog_run_as_its_own_service_stays_without_an_agent_and_still_fences(
    engine: Any, engine_url: str, tmp_path: Path, watchdogs: list[int]
) -> None:
    workdir = tmp_path / "agent"
    service = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers.watchdog",
            f"--workdir={workdir}",
            "--node=fence-4",
            f"--docker-host={engine_url}",
            "--stay",
        ],
        cwd=Path(__file__).resolve().parents[2],
    )
    watchdogs.append(service.pid)
    wait_until(lambda: (workdir / "watchdog.pid").exists())
    time.sleep(1.0)  # no agent, nothing running: an agent's watchdog would stand down here
    assert service.poll() is None
    # An agent starting now keeps the service rather than starting a watchdog of its own.
    assert ensure_watchdog(workdir=workdir, node="fence-4", docker_host=engine_url) == service.pid

    write_lease(lease_path(workdir), Lease(valid_until=time.time() + 1.0, boot="boot-1"))
    run = EngineWithoutGpus(engine, tmp_path, node="fence-4").start(
        engine_launch(["sleep", "60"], 923)
    )
    wait_until(lambda: state_of(engine, run.container_id)["Status"] == "exited")
    assert restarted_launcher(engine, tmp_path, "fence-4").fenced(923, 0) is not None
    run.release()
    service.kill()
    service.wait()


def test_a_restarted_agent_reports_an_attempt_fenced_while_it_was_down(
    engine: Any, engine_url: str, tmp_path: Path, watchdogs: list[int]
) -> None:
    """What the dead agent left: its journal (launched, started), a lease, a watchdog."""
    workdir = tmp_path / "agent"
    write_lease(lease_path(workdir), Lease(valid_until=time.time() + 1.0, boot="boot-1"))
    launch = engine_launch(["sh", "-c", "echo up; sleep 60"], 930)
    journal = AttemptJournal(tmp_path / "journal")
    journal.record_launch(launch)
    run = EngineWithoutGpus(engine, tmp_path, node="fence-5").start(launch)
    journal.record_started((930, 0), at=time.time(), pid=None, container=run.container_id)
    dead_agent = subprocess.Popen(["true"])
    dead_agent.wait()
    watchdogs.append(
        ensure_watchdog(
            workdir=workdir, node="fence-5", agent_pid=dead_agent.pid, docker_host=engine_url
        )
    )
    wait_until(lambda: state_of(engine, run.container_id)["Status"] == "exited")

    sender = RecordingSender()
    launcher = restarted_launcher(engine, tmp_path, "fence-5")
    restarted = supervisor_for(launcher, sender, tmp_path)
    restarted.recover(launcher.adopt())

    finished = sender.finished(930, timeout=60)
    assert (finished.outcome, finished.exit_code) == ("fenced", 137)
    assert "lease (boot boot-1) lapsed" in finished.error
    assert sender.log_text(930) == "up\n"
    assert containers_of(engine, launch) == []
    assert launcher.fenced(930, 0) is None  # the marker went with the container


# --- the agent process with the docker launcher -----------------------------------------------


def docker_agent_env(engine_url: str, workdir: Path, node: str) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "DOCKER_HOST": engine_url,
        "PORTAL_AGENT_LAUNCHER": "docker",
        "PORTAL_AGENT_NODE": node,
        "PORTAL_AGENT_KEY": key_to_text(bytes(range(KEY_BYTES))),
        "PORTAL_AGENT_GPU_SOURCE": "described",
        "PORTAL_AGENT_WORKDIR": str(workdir),
        "PORTAL_VAR_DIR": str(workdir.parent / "var"),
        # Nothing answers here: the watchdog must run before the agent reaches its broker.
        "PORTAL_BROKER_URL": f"redis+socket://{workdir.parent / 'no-broker.sock'}",
    }


def test_the_agent_builds_its_docker_launcher_on_its_work_directory(
    engine_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = docker_agent_env(engine_url, tmp_path / "agent", "agent-0")
    monkeypatch.setenv("DOCKER_HOST", engine_url)
    settings = AgentSettings.from_env(env)
    launcher = build_launcher(settings)
    assert isinstance(launcher, DockerLauncher)
    # Where the watchdog leaves its fence markers, so fenced attempts are reported fenced.
    assert launcher.workdir == settings.workdir


def test_a_docker_agent_starts_its_watchdog_before_it_consumes(
    engine: Any, engine_url: str, tmp_path: Path, watchdogs: list[int]
) -> None:
    workdir = tmp_path / "agent"
    log = (tmp_path / "agent.log").open("w")
    agent = subprocess.Popen(
        [sys.executable, "-m", "workers"],
        cwd=Path(__file__).resolve().parents[2],
        env=docker_agent_env(engine_url, workdir, "agent-1"),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: (workdir / "watchdog.pid").exists())
        pid = int((workdir / "watchdog.pid").read_text())
        watchdogs.append(pid)
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"workers.watchdog" in command and b"--node=agent-1" in command
        assert f"--workdir={workdir}".encode() in command
        # It guards this agent: the agent registered itself.
        assert (workdir / "agent.pid").read_text() == process_identity(agent.pid)
        assert agent.poll() is None
    finally:
        agent.kill()  # kill -9: the watchdog outlives its agent
        agent.wait()
        log.close()
    # No agent and no container of its node left: it stands down by itself.
    wait_until(lambda: process_identity(pid) is None)
    assert "Traceback" not in (tmp_path / "agent.log").read_text()
