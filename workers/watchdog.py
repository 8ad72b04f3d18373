"""The container watchdog: kills a node's job containers once the agent's lease has lapsed.

    python -m workers.watchdog --workdir DIR --node NAME [--docker-host URL] [--interval S]
                               [--stay]

The portal requeues a node's attempts only after the node's full lease has expired, so by
then every container of the node must have stopped, even when the agent is frozen (SIGSTOP)
or dead (kill -9). The agent cannot guarantee that itself; this small process does. Every
`--interval` seconds (0.5) it reads `<workdir>/lease.json` (workers.lease) and, once the lease
has lapsed or cannot be read, kills (SIGKILL) every running container labelled with its node.
Before each kill it writes `<workdir>/fenced/<job_id>-<attempt>` with the reason, so the agent
reports the attempt `fenced` (`DockerLauncher.fenced()`). It never removes a container: the
agent still reads the exit code and the last of the log, then removes it.

The agent starts it with `ensure_watchdog()`, detached in its own session so that a kill of
the agent (or of its process group) leaves it running. One runs per work directory: it holds
an exclusive lock on `<workdir>/watchdog.lock` for its whole life (the agent takes the lock
first and hands it to the child, so two can never run), and `<workdir>/watchdog.pid` names it.
A restarted agent calling `ensure_watchdog()` again keeps a watchdog that is still running
(and tells it its own pid) or starts a new one.

Where the agent runs in a container, a kill of the agent kills every process of that
container, the watchdog too: there it runs as a service of its own, `--stay`, with the same
work directory and engine (`ensure_watchdog()` then finds it running and starts none).

Otherwise it exits by itself when nothing is left to guard: no agent alive (the pid and
process start time in `<workdir>/agent.pid`) and no running container of its node. That
decision and the agent's registration happen under `<workdir>/watchdog.handover.lock`, so an
agent that starts while the watchdog stands down either is seen alive or starts a new
watchdog. A container whose agent died keeps running until the lease lapses (an agent
restarted in time renews the lease and adopts it), then it is killed, then the watchdog exits.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workers.launchers.docker import (
    ACTIVE_STATES,
    attempt_of,
    fence_marker_path,
    node_containers,
    write_fence_marker,
)
from workers.lease import Lease, lease_path, read_lease

log = logging.getLogger("workers.watchdog")

WATCHDOG_LOCK = "watchdog.lock"
HANDOVER_LOCK = "watchdog.handover.lock"
WATCHDOG_PID = "watchdog.pid"
WATCHDOG_LOG = "watchdog.log"
AGENT_PID = "agent.pid"
DEFAULT_INTERVAL_S = 0.5
# Engine calls must not hang a tick for long; a hung engine is retried on the next one.
ENGINE_TIMEOUT_S = 10
# A failing engine is logged once, then again at most this often.
ERROR_LOG_EVERY_S = 60.0
# The package root, so `python -m workers.watchdog` works from any directory.
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


# --- the agent's side -----------------------------------------------------------------------


def ensure_watchdog(
    *,
    workdir: Path,
    node: str,
    agent_pid: int | None = None,
    docker_host: str | None = None,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> int:
    """Register `agent_pid` (default: this process) as the agent to guard and make sure a
    watchdog runs for `workdir`; returns the watchdog's pid. Call it at agent start, before
    the first container starts. The watchdog reaches the engine at `docker_host`, else as
    the docker SDK does (`DOCKER_HOST`, inherited)."""
    workdir.mkdir(parents=True, exist_ok=True)
    with _locked(workdir / HANDOVER_LOCK):
        pid = os.getpid() if agent_pid is None else agent_pid
        _write_atomically(workdir / AGENT_PID, process_identity(pid) or str(pid))
        fd = os.open(workdir / WATCHDOG_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return _running_watchdog(workdir)
            watchdog = _spawn(
                workdir=workdir,
                node=node,
                lock_fd=fd,
                docker_host=docker_host,
                interval_s=interval_s,
            )
            _write_atomically(workdir / WATCHDOG_PID, str(watchdog.pid))
        finally:
            os.close(fd)  # the child holds the lock now (flock follows the open file)
    # Reap it should it end while this process lives; after our death init does.
    threading.Thread(target=watchdog.wait, name="watchdog-reaper", daemon=True).start()
    log.info("watchdog %s started for node %s in %s", watchdog.pid, node, workdir)
    return watchdog.pid


def _spawn(
    *, workdir: Path, node: str, lock_fd: int, docker_host: str | None, interval_s: float
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "workers.watchdog",
        f"--workdir={workdir}",
        f"--node={node}",
        f"--interval={interval_s}",
        f"--lock-fd={lock_fd}",
    ]
    if docker_host is not None:
        command.append(f"--docker-host={docker_host}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p
    )
    with (workdir / WATCHDOG_LOG).open("ab") as log_file:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            pass_fds=(lock_fd,),
            start_new_session=True,  # no signal sent to the agent's group reaches it
            cwd="/",
            env=env,
        )


# --- liveness -------------------------------------------------------------------------------


def process_identity(pid: int) -> str | None:
    """`<pid>:<start time>` of a live process (Linux /proc), so a reused pid is not taken
    for the agent; None when there is no such live process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    state, start_time = fields[0], fields[19]
    if state in ("Z", "X"):  # a zombie is dead; it only waits to be reaped
        return None
    return f"{pid}:{start_time}"


def agent_alive(workdir: Path) -> bool:
    try:
        registered = (workdir / AGENT_PID).read_text().strip()
        pid = int(registered.partition(":")[0])
    except (OSError, ValueError):
        return False
    identity = process_identity(pid)
    if identity is None:
        return False
    return ":" not in registered or identity == registered


# --- the watchdog's side --------------------------------------------------------------------


def fence(client: Any, *, node: str, workdir: Path, now: float) -> list[str]:
    """Kill every running container of `node`, each after its fence marker is written;
    returns the names of the containers killed."""
    killed: list[str] = []
    why = _lapse_reason(read_lease(lease_path(workdir)))
    for container in node_containers(client, node):
        if container.status not in ACTIVE_STATES:
            continue
        key = attempt_of(container)
        reason = f"{why}; the watchdog killed container {container.name} at {_iso(now)}"
        marked = key is not None and write_fence_marker(workdir, *key, reason)
        try:
            if container.status == "paused":
                container.unpause()
            container.kill()
        except Exception as exc:
            # Gone (404) or exited on its own first (409): not fenced. Anything else: the
            # next tick tries again. Either way the marker must not claim a kill.
            if marked and key is not None:
                fence_marker_path(workdir, *key).unlink(missing_ok=True)
            status = getattr(getattr(exc, "response", None), "status_code", None)
            if status not in (404, 409):
                log.error("could not kill %s (retrying): %s", container.name, exc)
            continue
        log.warning("fenced %s: %s", container.name, reason)
        killed.append(container.name)
    return killed


def stand_down(client: Any, *, node: str, workdir: Path, lock_fd: int) -> bool:
    """Release the watchdog's lock and return True when nothing is left to guard."""
    with _locked(workdir / HANDOVER_LOCK):
        if agent_alive(workdir):
            return False
        if any(c.status in ACTIVE_STATES for c in node_containers(client, node)):
            return False
        if _read_pid(workdir / WATCHDOG_PID) == os.getpid():
            (workdir / WATCHDOG_PID).unlink(missing_ok=True)
        os.close(lock_fd)  # inside the handover lock: a starting agent sees us gone
    return True


def watch(
    *,
    workdir: Path,
    node: str,
    connect: Callable[[], Any],
    lock_fd: int,
    interval_s: float = DEFAULT_INTERVAL_S,
    stay: bool = False,
    clock: Callable[[], float] = time.time,
) -> None:
    """The loop: fence once the lease lapsed, stand down when nothing is left to guard
    (never with `stay`). Returns only when it stood down; engine errors are logged and
    retried."""
    client: Any = None
    errors = _ErrorLog()
    while True:
        try:
            if client is None:
                client = connect()
            lease = read_lease(lease_path(workdir))
            now = clock()
            if lease is None or lease.expired(now):
                fence(client, node=node, workdir=workdir, now=now)
            if (
                not stay
                and not agent_alive(workdir)
                and stand_down(client, node=node, workdir=workdir, lock_fd=lock_fd)
            ):
                log.info("no agent and no running container of node %s: exiting", node)
                return
        except Exception as exc:  # an unreachable or slow engine: try again next tick
            errors.report(exc)
        time.sleep(interval_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers.watchdog",
        description="Kill a node's job containers once the agent's lease has lapsed.",
    )
    parser.add_argument("--workdir", type=Path, required=True, help="the agent's work directory")
    parser.add_argument("--node", required=True, help="the node whose containers it guards")
    parser.add_argument("--docker-host", help="engine URL (default: DOCKER_HOST, as the SDK)")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds")
    parser.add_argument("--lock-fd", type=int, help="the locked watchdog.lock (from the agent)")
    parser.add_argument(
        "--stay",
        action="store_true",
        help="never stand down: for running it as a service of its own (e.g. beside an agent "
        "that runs in a container, whose processes all die with it)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s"
    )
    workdir: Path = args.workdir.resolve()
    lock_fd = args.lock_fd if args.lock_fd is not None else _take_lock(workdir)
    if lock_fd is None:
        log.info("another watchdog guards %s: exiting", workdir)
        return 0
    _write_atomically(workdir / WATCHDOG_PID, str(os.getpid()))
    log.info("guarding node %s from %s every %ss", args.node, workdir, args.interval)

    def connect() -> Any:
        import docker  # type: ignore[import-untyped]

        if args.docker_host:
            return docker.DockerClient(base_url=args.docker_host, timeout=ENGINE_TIMEOUT_S)
        return docker.from_env(timeout=ENGINE_TIMEOUT_S)

    watch(
        workdir=workdir,
        node=args.node,
        connect=connect,
        lock_fd=lock_fd,
        interval_s=args.interval,
        stay=args.stay,
    )
    return 0


# --- helpers --------------------------------------------------------------------------------


class _ErrorLog:
    def __init__(self) -> None:
        self._last = ""
        self._at = 0.0

    def report(self, exc: Exception) -> None:
        text = f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        if text != self._last or now - self._at >= ERROR_LOG_EVERY_S:
            log.error("engine check failed (retrying every tick): %s", text)
            self._last, self._at = text, now


def _lapse_reason(lease: Lease | None) -> str:
    if lease is None:
        return "the agent's lease file is missing or unreadable"
    return f"the agent's lease (boot {lease.boot}) lapsed at {_iso(lease.valid_until)}"


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def _take_lock(workdir: Path) -> int | None:
    workdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(workdir / WATCHDOG_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _running_watchdog(workdir: Path) -> int:
    """The pid of the watchdog holding the lock. One started by hand writes its pid file
    just after taking the lock: give it a moment."""
    deadline = time.monotonic() + 5.0
    while (pid := _read_pid(workdir / WATCHDOG_PID)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{workdir / WATCHDOG_LOCK} is held but {WATCHDOG_PID} is missing")
        time.sleep(0.05)
    return pid


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


if __name__ == "__main__":
    sys.exit(main())
