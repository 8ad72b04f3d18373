"""The job every chaos run submits: it records what really ran, outside the portal.

    python chaos_job.py <truth dir> <lines> <seconds>

Appends to `<truth dir>/<job id>.log`, one line per record, each written with one O_APPEND
write and fsynced (so a line is whole and survives the job being killed right after):

    start <job_id> <attempt> <time> <pid> <cwd>
    tick  <job_id> <attempt> <time> <pid>      every TICK_S while it runs
    term  <job_id> <attempt> <time> <pid>      on SIGTERM, then it exits 143 without `end`
    end   <job_id> <attempt> <time> <pid>      after its last output line

(the pid on every line tells two runs of one attempt apart).

In between it prints `<lines>` numbered lines to stdout over `<seconds>` (the log the
portal must ship whole and in order). The job id and attempt come from PORTAL_JOB_ID and
PORTAL_JOB_ATTEMPT, which the agent sets.

A closed stdout (the agent that read it was killed) does not stop the job: a container's
output goes to the engine, which outlives the agent, so the job keeps running like a real
one would. Standalone on purpose: it imports nothing from the project, since it may run as
another user in a sandbox.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

TICK_S = 0.5


def main(argv: list[str]) -> int:
    truth_dir, lines, seconds = argv[1], int(argv[2]), float(argv[3])
    job_id = os.environ["PORTAL_JOB_ID"]
    attempt = os.environ["PORTAL_JOB_ATTEMPT"]
    fd = os.open(
        os.path.join(truth_dir, f"{job_id}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666
    )
    if os.fstat(fd).st_uid == os.geteuid():
        # The job's umask (the agent's 077) took the others' bits away, and the job's next
        # attempt runs as another uid: it must be able to append here too.
        os.fchmod(fd, 0o666)

    pid = os.getpid()

    def record(kind: str, extra: str = "") -> None:
        os.write(fd, f"{kind} {job_id} {attempt} {time.time():.6f} {pid}{extra}\n".encode())
        os.fsync(fd)

    def on_term(signum: int, frame: object) -> None:
        record("term")
        os._exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    record("start", f" {os.getcwd()}")
    out_ok = True
    started = time.monotonic()
    next_tick = started + TICK_S
    for number in range(1, lines + 1):
        due = started + seconds * number / lines
        while (now := time.monotonic()) < due:
            time.sleep(max(0.0, min(due, next_tick) - now))  # "now" was read a moment ago
            if time.monotonic() >= next_tick:
                record("tick")
                next_tick += TICK_S
        if out_ok:
            try:
                sys.stdout.write(f"chaos-line job={job_id} attempt={attempt} {number}/{lines}\n")
                sys.stdout.flush()
            except OSError:
                # Point fd 1 at /dev/null so what is still buffered flushes somewhere at exit
                # (a failed flush at exit would turn our exit code into 120).
                out_ok = False
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
    if out_ok:
        with contextlib.suppress(OSError):
            sys.stdout.flush()
    record("end")
    # Exit at once: `end` means the job is done, and the interpreter's own shutdown after it
    # would leave a window in which a kill (the agent's death) turns a finished job into a
    # killed one, which the portal rightly runs again.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
