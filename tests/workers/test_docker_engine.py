"""The Docker launcher against a real Docker engine that the test starts itself.

Skipped unless `dockerd` is installed and the tests run as root. The engine runs with the
vfs storage driver and no networking; the image is imported from a tarball of the host's
/bin/sh and /bin/sleep with their libraries (no registry). There is no NVIDIA runtime here,
so a real launch must fail at the GPU device request and leave no container behind; the
container lifecycle (logs, exit code, stop with grace, removal) is exercised with the
launcher's own request minus that device request.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_doubles import GPU_0, RecordingSender, make_launch

from workers.launch import job_environment
from workers.launchers.docker import DockerLauncher, DockerRun, container_request
from workers.protocol import Launch, Started, Stop
from workers.supervisor import Supervisor

docker = pytest.importorskip("docker")
DOCKERD = shutil.which("dockerd")
IMAGE = "portal-agent-test:1"

pytestmark = pytest.mark.skipif(
    DOCKERD is None or os.geteuid() != 0, reason="needs dockerd and root to start an engine"
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
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
        yield client
    finally:
        client.close()
        daemon.terminate()
        daemon.wait(30)
        log.close()


def wait_for_engine(client: Any, daemon: subprocess.Popen[bytes], root: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            client.ping()
            return
        except Exception:
            if time.monotonic() > deadline or daemon.poll() is not None:
                pytest.skip(f"dockerd did not start: {(root / 'dockerd.log').read_text()[-500:]}")
            time.sleep(0.2)


def minimal_rootfs() -> bytes:
    """A tarball with /bin/sh, /bin/sleep and the shared libraries they load."""
    binaries = ["/bin/sh", "/bin/sleep"]
    ldd = subprocess.run(["ldd", *binaries], capture_output=True, text=True, check=True).stdout
    # ldd prints "/bin/sh:" headers, then "libc.so.6 => /lib/.../libc.so.6 (0x...)" lines.
    libraries = {w for w in ldd.split() if w.startswith("/") and not w.endswith(":")}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted({*binaries, *libraries}):
            data = Path(path).read_bytes()  # follows symlinks: the file itself goes in
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def containers_of(client: Any, launch: Launch) -> list[Any]:
    label = f"portal.job_id={launch.job_id}"
    return client.containers.list(all=True, filters={"label": label})


def test_without_an_nvidia_runtime_a_launch_fails_cleanly(engine: Any, tmp_path: Path) -> None:
    sender = RecordingSender()
    launcher = DockerLauncher(node="n1", mps_root=tmp_path, client=engine, network="none")
    supervisor = Supervisor(node="n1", launcher=launcher, send=sender)
    launch = make_launch(["sh", "-c", "echo hi"], job_id=901)
    launch = Launch(**{**launch.__dict__, "image": IMAGE})
    supervisor.launch(launch)
    finished = sender.finished(901)
    assert (finished.outcome, finished.exit_code) == ("launch_error", None)
    assert "nvidia" in finished.error  # the engine refused exactly the GPU device request
    assert sender.of_type(Started) == []
    assert containers_of(engine, launch) == []


class EngineWithoutGpus:
    """The Docker launcher's own request, minus the GPU device request this engine lacks."""

    name = "docker-without-gpus"

    def __init__(self, client: Any, mps_root: Path) -> None:
        self.client = client
        self.mps_root = mps_root

    def start(self, launch: Launch) -> DockerRun:
        env = job_environment(launch, mps_root=self.mps_root)
        request = container_request(
            launch, env=env, mps_root=self.mps_root, node="n1", network="none"
        )
        del request["device_requests"]
        container = self.client.containers.create(**request)
        container.start()
        return DockerRun(container)


def engine_launch(command: list[str], job_id: int) -> Launch:
    launch = make_launch(command, job_id=job_id, env={"GREETING": "hello"})
    return Launch(**{**launch.__dict__, "image": IMAGE})


def test_a_container_ships_its_log_and_exit_code_and_is_removed(
    engine: Any, tmp_path: Path
) -> None:
    sender = RecordingSender()
    supervisor = Supervisor(node="n1", launcher=EngineWithoutGpus(engine, tmp_path), send=sender)
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
    supervisor = Supervisor(node="n1", launcher=EngineWithoutGpus(engine, tmp_path), send=sender)
    launch = engine_launch(["sh", "-c", "echo up; sleep 60"], 903)
    supervisor.launch(launch)
    sender.wait_for(lambda m: getattr(m, "data", "") == "up\n", timeout=60)
    supervisor.stop(Stop(job_id=903, attempt=0, reason="cancel", grace_s=1.0))
    finished = sender.finished(903, timeout=60)
    # sh as PID 1 ignores SIGTERM, so `docker stop` kills it when the grace runs out.
    assert (finished.outcome, finished.exit_code) == ("cancelled", 137)
    assert containers_of(engine, launch) == []
