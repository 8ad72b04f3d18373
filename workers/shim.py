"""The per-job shim: one small process between the agent and each local job.

`ProcessLauncher` starts `python -m workers.shim` instead of the command. The shim starts the
command in its own session and process group and stays its parent until it ends, so that the
job cannot outlive the agent's claim to run it:

- **Lifeline.** The agent holds the other end of a socket pair whose end the shim holds. When
  the agent dies, even by SIGKILL, the shim reads end-of-file and kills the job's whole process
  group (and every process of the job's uid) at once. PR_SET_PDEATHSIG is a second line: it
  sends the shim SIGTERM, handled the same way, when the agent thread that forked it ends.
- **Lease fencing.** Every `LEASE_CHECK_S` the shim reads the agent's lease file; once it
  lapsed (or cannot be read) it writes `<attempt dir>/fenced` with the reason, stops the job
  (SIGTERM, SIGKILL after the fence grace) and exits with the job's status. It is a separate
  process so this works while the agent itself is frozen (SIGSTOP, a swapped-out host).
- **Stop.** The agent asks for a stop over the same socket (`stop <grace>`, `kill`), so only
  the job's parent ever signals its process group: the group id cannot have been reused.
- **Exit record.** When the job ends the shim writes `<attempt dir>/exit`: its exit code and
  whether a stop signal reached it while it ran. A job that ended on its own keeps its own
  result even if a stop was asked for at that moment, and even if the agent died before it
  read the status: the restarted agent reports it from the record (see `ended_runs`).
- **Uid claim.** With job uids the shim inherits the launcher's host-wide claim on the job's
  uid (a flock, see `JobUids`) and holds it until it exits, after its last sweep of the uid:
  when the agent dies the uid is not handed to another attempt (by another agent on the host)
  while this shim may still kill every process of it.
- **Isolation.** Before the job starts the shim unshares the network namespace (as root; else a
  user and network namespace) and the job then runs with the uid and gid the launcher chose,
  with no supplementary groups. The shim itself stays the agent's user, out of the job's reach.
- **Limits.** The shim makes the job's cgroup (when the launcher found cgroup v2 usable) and
  forks the job under its rlimits and inside its cgroup (`workers.limits.spawn_limits`), so the
  job never runs a moment unlimited. When the job ends it kills the whole cgroup, records how
  many processes the OOM killer ended (in the exit record) and removes it.

Wire protocol on the socket (one line each): the agent sends a JSON request (`command`, `env`,
and the limits: `address_space`, `nproc`, `cgroup` with its `path`, `mount` and `values`);
the shim answers `started <pid>` or `error <message>`; after that the agent may send `stop <s>`
or `kill`. The shim's exit status is the job's (128 + n for a signal n). Its stdout and stderr
are the job's output pipe, so its few notes reach the job's log.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from workers.launch import LEASE_LAPSED_TEXT
from workers.lease import read_lease
from workers.limits import (
    create_cgroup,
    kill_cgroup,
    nproc_limit,
    oom_kills,
    own_cgroup,
    remove_cgroup,
    spawn_limits,
    tasks_of,
)

LEASE_CHECK_S = 0.5
REQUEST_TIMEOUT_S = 30.0
PID_FILE = "pid"
FENCED_FILE = "fenced"
EXIT_FILE = "exit"
# The job's stdout and stderr (and the shim's own errors), opened by the agent for the shim:
# the agent reads it while the job runs, and a restarted agent reads what is left.
OUTPUT_FILE = "output"
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
# A job that forks faster than we kill is given up on after this many sweeps.
SWEEP_ROUNDS = 50


class ShimError(Exception):
    """The job could not be started; the message goes back to the agent as the launch error."""


# --- namespaces and process records: shared with the launcher -------------------------------


def unshare_network(*, as_root: bool) -> None:
    """Give this process (and what it starts) a network namespace of its own: only a loopback
    interface that is down, so no TCP or abstract unix socket on the host is reachable. Without
    root this needs an unprivileged user namespace too; its uid and gid map to ours."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET if as_root else CLONE_NEWUSER | CLONE_NEWNET
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")
    if not as_root:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot: with the pid, it names one process
    for good (a pid alone may be reused). None once it is gone or a zombie (which runs
    nothing; an init that does not reap may keep zombies for long)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[19])


@dataclass(frozen=True)
class ProcStat:
    pid: int
    pgid: int
    uid: int


def processes() -> list[ProcStat]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue  # a zombie runs nothing and cannot be killed
        # The real uid from `status`: the owner of /proc/<pid> turns root for a process that
        # made itself non-dumpable, which would hide it from a sweep.
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        uid = int(uid_line.split()[1])
        found.append(ProcStat(pid=int(entry.name), pgid=int(fields[2]), uid=uid))
    return found


def write_record(attempt_dir: Path, record: dict[str, Any]) -> None:
    """Replace the attempt's pid file atomically; only the agent's user may read it."""
    fd, tmp = tempfile.mkstemp(dir=attempt_dir, prefix=".pid-", suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        json.dump(record, out)
    os.replace(tmp, attempt_dir / PID_FILE)


def read_record(attempt_dir: Path) -> dict[str, int]:
    try:
        data = json.loads((attempt_dir / PID_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, int) and not isinstance(v, bool)}


def write_exit(attempt_dir: Path, code: int, *, stopped: bool, oom_kills: int = 0) -> None:
    """Record how the job ended, once (the first record stands), durably: a restarted agent
    reads it to report the job's own result instead of losing it. `stopped`: a stop signal
    (the agent's, the lease fence's, the agent's death) reached the job while it ran.
    `oom_kills`: processes of the job the kernel's OOM killer ended (its cgroup's count)."""
    final = attempt_dir / EXIT_FILE
    if final.exists():
        return
    fd, tmp = tempfile.mkstemp(dir=attempt_dir, prefix=".exit-", suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        json.dump({"code": code, "stopped": stopped, "oom_kills": oom_kills}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, final)
    with contextlib.suppress(OSError):
        dir_fd = os.open(attempt_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class ExitRecord(NamedTuple):
    """How the job ended, as the shim recorded it (see `write_exit`)."""

    code: int
    stopped: bool
    oom_kills: int = 0


def read_exit(attempt_dir: Path) -> ExitRecord | None:
    """The shim's exit record; None if it wrote none (still running, or the shim itself was
    killed)."""
    try:
        data = json.loads((attempt_dir / EXIT_FILE).read_text())
        return ExitRecord(int(data["code"]), bool(data["stopped"]), int(data.get("oom_kills", 0)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def process_is(pid: int | None, started: int | None) -> bool:
    return pid is not None and pid > 0 and started is not None and start_time(pid) == started


def group_alive(pgid: int, leader_start: int | None) -> bool:
    """Whether the job's process group still has members. A group id cannot be handed out
    again while any member lives, so: the leader itself (same start time), or, with the
    leader gone, any process still in that group."""
    leader_now = start_time(pgid)
    if leader_now is not None and leader_now != leader_start:
        return False  # the number now leads another group: ours emptied long ago
    return any(p.pgid == pgid for p in processes())


def kill_uid(uid: int) -> None:
    """SIGKILL every process running as `uid` (a job uid from the pool, never ours or root's):
    this reaches what a job moved out of its process group (setsid, double fork)."""
    if uid in (0, os.getuid()):
        raise ValueError(f"refusing to kill every process of uid {uid}")
    for _ in range(SWEEP_ROUNDS):
        victims = [p.pid for p in processes() if p.uid == uid]
        if not victims:
            return
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


# --- the shim ---------------------------------------------------------------------------------


class Shim:
    def __init__(self, args: argparse.Namespace) -> None:
        self.attempt_dir = Path(args.attempt_dir)
        self.work_dir = Path(args.work_dir)
        self.lease = Path(args.lease) if args.lease else None
        self.lease_epoch: int | None = args.lease_epoch
        self.fence_grace_s: float = args.fence_grace
        self.uid: int | None = args.uid
        # Held, never closed: the kernel drops the claim when this process is gone.
        self.uid_claim_fd: int | None = args.uid_claim_fd
        self.gid: int | None = args.gid
        self.network: str = args.network
        self.sock = socket.socket(fileno=args.fd)
        self.job: subprocess.Popen[bytes] | None = None
        self.kill_at: float | None = None  # monotonic deadline of a pending SIGKILL
        self.buffer = b""
        # A stop signal reached the job while it ran. A job that ended on its own before any
        # did keeps its own result, even when a stop was asked for at the same moment.
        self.stopped = False
        self.cgroup: Path | None = None  # the job's, while it exists
        self.oom_kills = 0
        # The agent's end (PDEATHSIG's SIGTERM) can land while the job is being started: after
        # its fork, before `self.job` is set. It is kept for then, or the job would run on
        # with nobody to stop it and no record to find it by.
        self._spawning = False
        self._gone_while_spawning = False

    # Setup ------------------------------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._agent_gone)
        # The uid is recorded from the start: if this shim is killed before it records the
        # job's group, a restarted agent still finds the job by its uid.
        uid = self.uid if self.uid is not None else -1
        write_record(
            self.attempt_dir, {"shim": os.getpid(), "shim_start": _own_start(), "uid": uid}
        )
        try:
            request = self._read_request()
            self._check_lease_before_start()
            if self.network == "isolate":
                try:
                    unshare_network(as_root=os.geteuid() == 0)
                except OSError as exc:
                    raise ShimError(
                        f"cannot give the job its own network namespace: {exc}"
                    ) from None
            self._spawning = True
            try:
                self.job = self._spawn(request)
            finally:
                self._spawning = False
        except ShimError as exc:
            if self.cgroup is not None:
                remove_cgroup(self.cgroup)
            self._reply(f"error {exc}")
            return 1
        assert self.job is not None
        pid = self.job.pid
        write_record(
            self.attempt_dir,
            {
                "shim": os.getpid(),
                "shim_start": _own_start(),
                "pgid": pid,
                "pgid_start": start_time(pid) or 0,
                "uid": uid,
            },
        )
        if self._gone_while_spawning:
            self._agent_gone(signal.SIGTERM, None)
        self._reply(f"started {pid}")
        return self._supervise()

    def _read_request(self) -> dict[str, Any]:
        self.sock.settimeout(REQUEST_TIMEOUT_S)
        while b"\n" not in self.buffer:
            data = self.sock.recv(65536)
            if not data:
                raise SystemExit(0)  # the agent went away before asking: nothing started
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        self.sock.settimeout(None)
        request: dict[str, Any] = json.loads(line)
        return request

    def _check_lease_before_start(self) -> None:
        if self.lease is None:
            return
        lease = read_lease(self.lease)
        now = time.time()
        if lease is None or lease.expired(now):
            raise ShimError(f"{LEASE_LAPSED_TEXT}: not starting ({self._why(now)})")
        if self.lease_epoch is not None and lease.epoch != self.lease_epoch:
            # It ran out after the agent accepted this launch (the agent fenced every attempt
            # then) and was held again since: the portal may run this attempt elsewhere now.
            raise ShimError(
                f"{LEASE_LAPSED_TEXT}: not starting (the launch was accepted in lease epoch "
                f"{self.lease_epoch}; the lease ran out since and is now in epoch {lease.epoch})"
            )

    def _job_rlimits(self, request: dict[str, Any]) -> dict[str, int]:
        rlimits: dict[str, int] = {}
        if request.get("address_space"):
            rlimits["AS"] = int(request["address_space"])
        if request.get("nproc"):
            own_uid = self.uid is not None and self.uid != os.getuid()
            nproc = nproc_limit(int(request["nproc"]), own_uid=own_uid, tasks_of=tasks_of)
            if nproc is not None:
                rlimits["NPROC"] = nproc
        return rlimits

    def _make_cgroup(self, request: dict[str, Any]) -> tuple[Path, Path] | None:
        """The job's cgroup, made now, and the shim's own (to return to): None without one."""
        spec = request.get("cgroup")
        if not spec:
            return None
        path, mount = Path(spec["path"]), Path(spec["mount"])
        try:
            home = own_cgroup(mount)
            create_cgroup(path, {str(k): str(v) for k, v in spec["values"].items()})
        except OSError as exc:
            raise ShimError(f"cannot make the job's cgroup {path}: {exc}") from None
        self.cgroup = path
        return path, home

    def _spawn(self, request: dict[str, Any]) -> subprocess.Popen[bytes]:
        command = [str(part) for part in request["command"]]
        env = {str(k): str(v) for k, v in request["env"].items()}
        switch: dict[str, Any] = {}
        if self.uid is not None and self.gid is not None:
            switch = {"user": self.uid, "group": self.gid, "extra_groups": []}
        rlimits = self._job_rlimits(request)
        cgroup, home = self._make_cgroup(request) or (None, None)
        job: subprocess.Popen[bytes] | None = None
        try:
            with spawn_limits(rlimits=rlimits, cgroup=cgroup, home=home):
                try:
                    job = subprocess.Popen(
                        command,
                        env=env,
                        cwd=self.work_dir,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,  # own session and group: a stop reaches all
                        **switch,
                    )
                except OSError as exc:
                    raise self._start_error(exc, command) from None
        except MemoryError:
            raise ShimError(
                f"the job's address space limit ({rlimits.get('AS')} bytes) is too small to "
                "start it"
            ) from None
        except OSError as exc:  # moving into or out of the cgroup, an rlimit refused
            if job is not None:
                kill_group(job.pid, signal.SIGKILL)
                job.wait()
            raise ShimError(f"cannot put the job under its limits: {exc}") from None
        assert job is not None
        return job

    def _start_error(self, exc: OSError, command: list[str]) -> ShimError:
        if exc.filename == str(self.work_dir):
            return ShimError(f"cannot enter the work directory {self.work_dir}: {exc.strerror}")
        if isinstance(exc, FileNotFoundError):
            return ShimError(f"command not found: {command[0]}")
        if isinstance(exc, PermissionError):
            by = f" by the job's uid {self.uid}" if self.uid is not None else ""
            return ShimError(f"command is not executable{by}: {command[0]}")
        return ShimError(f"cannot start {command[0]}: {exc.strerror}")

    def _reply(self, line: str) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(line.encode() + b"\n")

    # Supervision ------------------------------------------------------------------------------

    def _supervise(self) -> int:
        assert self.job is not None
        pidfd = os.pidfd_open(self.job.pid)
        next_lease_check = time.monotonic()
        while True:
            now = time.monotonic()
            if self.kill_at is not None and now >= self.kill_at:
                self._signal_job(signal.SIGKILL)
                self.kill_at = None
            if self.lease is not None and now >= next_lease_check:
                next_lease_check = now + LEASE_CHECK_S
                self._fence_if_lease_expired()
            deadlines = [next_lease_check if self.lease is not None else now + 3600]
            if self.kill_at is not None:
                deadlines.append(self.kill_at)
            timeout = max(0.0, min(deadlines) - time.monotonic())
            readable, _, _ = select.select([self.sock.fileno(), pidfd], [], [], timeout)
            if pidfd in readable:
                return self._job_ended()
            if self.sock.fileno() in readable:
                self._read_commands()

    def _read_commands(self) -> None:
        assert self.job is not None
        try:
            data = self.sock.recv(4096)
        except OSError:
            data = b""
        if not data:
            self._agent_gone(0, None)
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            word, _, arg = line.decode(errors="replace").partition(" ")
            if word == "stop":
                self._stop(float(arg or 0))
            elif word == "kill":
                self._signal_job(signal.SIGKILL)

    def _stop(self, grace_s: float) -> None:
        assert self.job is not None
        self._signal_job(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        if self.kill_at is None or deadline < self.kill_at:
            self.kill_at = deadline

    def _fence_if_lease_expired(self) -> None:
        assert self.lease is not None
        lease = read_lease(self.lease)
        now = time.time()
        if lease is not None and not lease.expired(now):
            return
        if (self.attempt_dir / FENCED_FILE).exists():
            return  # fenced already; the SIGKILL is pending
        if self._exited():
            return  # it ended on its own: the loop reports that, nothing to fence
        reason = f"{self._why(now)}; stopped with SIGTERM, SIGKILL after {self.fence_grace_s:g}s"
        (self.attempt_dir / FENCED_FILE).write_text(reason + "\n")
        with contextlib.suppress(OSError):  # nobody reads the log any more: still fence
            print(f"[agent] {reason}", file=sys.stderr, flush=True)
        self._stop(self.fence_grace_s)

    def _why(self, now: float) -> str:
        assert self.lease is not None
        lease = read_lease(self.lease)
        if lease is None:
            return f"no readable lease at {self.lease} at {_clock(now)}"
        return f"lease expired at {_clock(lease.valid_until)}, noticed at {_clock(now)}"

    def _agent_gone(self, signum: int, frame: object) -> None:
        """The agent died (lifeline closed) or the shim was told to go: nothing may keep
        running in the job's name. A job that had already ended keeps its own result in the
        exit record, for the restarted agent to report."""
        # Once only: the agent's death closes the lifeline and sends PDEATHSIG's SIGTERM at
        # nearly the same moment. A second run, entered by the signal after the first had
        # reaped the job, would find no status left and record exit code 0.
        if self._spawning:
            self._gone_while_spawning = True  # `run` comes back here once the job is known
            return
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.job is None:
            os._exit(1)  # nothing started yet
        ended = self._exit_status()
        if ended is None:
            self.stopped = True
        kill_group(self.job.pid, signal.SIGKILL)
        self._cleanup()
        # Not Popen.wait(): this may run as a signal handler (PDEATHSIG) that interrupted the
        # main loop inside Popen's own wait, whose lock it would then wait for forever.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.job.pid, 0)
        code = 128 + signal.SIGKILL if ended is None else ended
        with contextlib.suppress(OSError):
            write_exit(self.attempt_dir, code, stopped=self.stopped, oom_kills=self.oom_kills)
        os._exit(code)

    def _job_ended(self) -> int:
        assert self.job is not None
        # Look at the exit without reaping: the group id stays ours while we kill the rest.
        code = self._exit_status()
        kill_group(self.job.pid, signal.SIGKILL)
        self._cleanup()
        self.job.wait()
        code = 0 if code is None else code
        with contextlib.suppress(OSError):
            write_exit(self.attempt_dir, code, stopped=self.stopped, oom_kills=self.oom_kills)
        return code

    def _exit_status(self) -> int | None:
        """The job's exit code (128 + n for signal n) once it has exited, without reaping it
        (its group id stays ours while we kill the rest); None while it runs."""
        assert self.job is not None
        try:
            status = os.waitid(os.P_PID, self.job.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self.job.returncode if self.job.returncode is not None else 0
        if status is None:
            return None
        if status.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
            return 128 + status.si_status
        return status.si_status

    def _exited(self) -> bool:
        return self._exit_status() is not None

    def _signal_job(self, sig: signal.Signals) -> None:
        """Signal the job's group unless the job has already exited: then the loop reports
        its own end, and no stop is said to have reached it."""
        assert self.job is not None
        if self._exited():
            return
        self.stopped = True
        kill_group(self.job.pid, sig)

    def _cleanup(self) -> None:
        if self.cgroup is not None:
            # Everything the job started, whatever its uid or process group: at once.
            with contextlib.suppress(OSError):
                kill_cgroup(self.cgroup)
            self.oom_kills = oom_kills(self.cgroup)
            if remove_cgroup(self.cgroup):
                self.cgroup = None
        if self.uid is not None:
            kill_uid(self.uid)
            # The attempt is over: no other job uid may enter its files from now on.
            with contextlib.suppress(OSError):
                os.chmod(self.attempt_dir, 0o700)


def _own_start() -> int:
    return start_time(os.getpid()) or 0


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch)) + f".{int(epoch % 1 * 10)}"


def probe_network_isolation() -> str:
    """'' when this process may unshare its network namespace, else why not (run in a child:
    the namespace change cannot be undone)."""
    try:
        unshare_network(as_root=os.geteuid() == 0)
    except OSError as exc:
        return str(exc.strerror or exc)
    return ""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m workers.shim")
    parser.add_argument("--probe", action="store_true", help="say whether netns works, exit")
    parser.add_argument("--fd", type=int, help="this end of the agent's socket pair")
    parser.add_argument("--parent", type=int, help="the agent's pid")
    parser.add_argument("--attempt-dir")
    parser.add_argument("--work-dir")
    parser.add_argument("--lease", default="")
    # The lease epoch the agent accepted the launch in (workers.lease): not started in another.
    parser.add_argument("--lease-epoch", type=int, default=None)
    parser.add_argument("--fence-grace", type=float, default=2.0)
    parser.add_argument("--uid", type=int)
    parser.add_argument("--gid", type=int)
    parser.add_argument("--uid-claim-fd", type=int, help="the inherited claim on --uid")
    parser.add_argument("--network", choices=("isolate", "host"), default="host")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.probe:
        reason = probe_network_isolation()
        print(reason or "ok")
        return 0
    # Second line of defence behind the lifeline: SIGTERM when the forking agent thread ends.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != args.parent:
        return 1  # the agent died before the prctl: start nothing
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    return Shim(args).run()


def exit_with(code: int) -> None:
    """Exit with the job's status. Not sys.exit(): if nobody reads the output pipe any more,
    flushing a note still buffered for it at exit would fail and turn the status into 120."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_with(main())
