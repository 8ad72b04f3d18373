"""The agent's job bookkeeping: launch and stop handling, supervision, reports.

No Celery here: the agent's tasks call `Supervisor.launch` / `Supervisor.stop`, and every
report goes through `send(message)`, so tests drive it with a recording sender.

Idempotency is by (job_id, attempt): a repeated launch of an attempt this agent knows does
nothing but re-report where it is (`started` or `finished`); a stop for an attempt it never
saw reports `finished` with the stop's outcome and remembers it, so a launch that arrives
after its stop never starts it.
"""

from __future__ import annotations

import codecs
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from workers.launch import LaunchError, dropped_user_keys
from workers.launchers import Launcher, Run, describe_exit
from workers.protocol import (
    LOG_CHUNK_MAX_BYTES,
    Finished,
    JobRef,
    Launch,
    LogChunk,
    Message,
    Started,
    Stop,
)

log = logging.getLogger(__name__)

OUTCOME_FOR_STOP = {"cancel": "cancelled", "preempt": "preempted", "time_limit": "timed_out"}
# Finished attempts are remembered so a late duplicate launch does not run them again.
REMEMBERED_ATTEMPTS = 10_000
# How long to wait for the rest of the output once the attempt exited.
OUTPUT_DRAIN_S = 10.0

Key = tuple[int, int]
Send = Callable[[Message], None]


def utf8_pieces(text: str, max_bytes: int = LOG_CHUNK_MAX_BYTES) -> Iterator[str]:
    """Split text into pieces of at most `max_bytes` UTF-8 bytes, never inside a character."""
    data = text.encode("utf-8")
    while data:
        cut = min(len(data), max_bytes)
        while cut < len(data) and data[cut] & 0xC0 == 0x80:
            cut -= 1  # back off to the start of a character
        yield data[:cut].decode("utf-8")
        data = data[cut:]


class LogShipper:
    """Turns an attempt's raw output into numbered `log` messages of valid UTF-8 text."""

    def __init__(self, emit: Callable[[int, str], None]) -> None:
        self._emit = emit
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.seq = 0

    def text(self, text: str) -> None:
        for piece in utf8_pieces(text):
            self._emit(self.seq, piece)
            self.seq += 1

    def feed(self, data: bytes) -> None:
        self.text(self._decoder.decode(data))

    def close(self) -> None:
        self.text(self._decoder.decode(b"", final=True))


@dataclass
class Attempt:
    key: Key
    launch: Launch | None
    run: Run | None = None
    started: Started | None = None
    finished: Finished | None = None
    stop_reason: str | None = None
    stop_grace_s: float = 0.0
    stop_note: str = ""


class Supervisor:
    def __init__(
        self,
        *,
        node: str,
        launcher: Launcher,
        send: Send,
        kill_grace_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.launcher = launcher
        self._send = send
        self.kill_grace_s = kill_grace_s
        self._clock = clock
        self._lock = threading.Lock()
        self._attempts: OrderedDict[Key, Attempt] = OrderedDict()
        self._threads: dict[Key, threading.Thread] = {}
        self._shutting_down = False

    # --- handlers (called from the agent's Celery tasks) ------------------------------------

    def launch(self, msg: Launch) -> None:
        """Start the attempt on a supervision thread and return at once."""
        key = (msg.job_id, msg.attempt)
        with self._lock:
            attempt = self._attempts.get(key)
            if attempt is None and not self._shutting_down:
                attempt = self._remember(Attempt(key=key, launch=msg))
                thread = threading.Thread(
                    target=self._supervise, args=(attempt,), name=f"job-{key[0]}-{key[1]}"
                )
                self._threads[key] = thread
                thread.start()
                return
        if attempt is None:
            log.warning("agent shutting down: launch of job %s attempt %s refused", *key)
            return
        log.info("job %s attempt %s launched again: re-reporting its state", *key)
        self._report_current(attempt)

    def stop(self, msg: Stop) -> None:
        key = (msg.job_id, msg.attempt)
        to_terminate: Run | None = None
        with self._lock:
            attempt = self._attempts.get(key)
            if attempt is None:
                attempt = self._remember(Attempt(key=key, launch=None))
                attempt.finished = self._finished(
                    key,
                    exit_code=None,
                    outcome=OUTCOME_FOR_STOP[msg.reason],
                    error=f"stopped ({msg.reason}) before it started on {self.node}",
                )
            elif (
                attempt.finished is None
                and attempt.stop_reason is None
                and (attempt.run is None or not attempt.run.has_exited())
            ):
                # An attempt that already exited keeps its own outcome.
                attempt.stop_reason = msg.reason
                attempt.stop_grace_s = msg.grace_s
                # A starting attempt has no run yet: its thread sees stop_reason instead.
                to_terminate = attempt.run
            finished = attempt.finished
        if to_terminate is not None:
            to_terminate.terminate(msg.grace_s)
        if finished is not None:
            self._send_safely(finished)

    def running(self) -> list[JobRef]:
        """Attempts started here and not finished: the heartbeat's `running` list."""
        with self._lock:
            return [
                JobRef(job_id=a.key[0], attempt=a.key[1])
                for a in self._attempts.values()
                if a.launch is not None and a.finished is None
            ]

    def running_launches(self) -> list[Launch]:
        """The launch messages of the attempts running now (for GPU metrics)."""
        with self._lock:
            return [
                a.launch
                for a in self._attempts.values()
                if a.launch is not None and a.started is not None and a.finished is None
            ]

    def shutdown(self, grace_s: float | None = None) -> None:
        """Stop every running attempt (reported as preempted, so the portal requeues it)
        and wait for their supervision threads."""
        grace = self.kill_grace_s if grace_s is None else grace_s
        with self._lock:
            self._shutting_down = True
            runs: list[Run] = []
            for attempt in self._attempts.values():
                if attempt.finished is None and attempt.stop_reason is None:
                    attempt.stop_reason = "preempt"
                    attempt.stop_grace_s = grace
                    attempt.stop_note = f"agent on {self.node} shut down"
                    if attempt.run is not None:
                        runs.append(attempt.run)
            threads = list(self._threads.values())
        for run in runs:
            run.terminate(grace)
        self.join(timeout=grace + OUTPUT_DRAIN_S, threads=threads)

    def join(self, timeout: float, threads: list[threading.Thread] | None = None) -> bool:
        """Wait for supervision threads to end; True when all did (tests and shutdown)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            pending = list(self._threads.values()) if threads is None else threads
        for thread in pending:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in pending)

    # --- supervision (one thread per attempt) -----------------------------------------------

    def _supervise(self, attempt: Attempt) -> None:
        try:
            self._run_attempt(attempt)
        except Exception as exc:  # never leave an attempt without a `finished`
            log.exception("supervising job %s attempt %s failed", *attempt.key)
            self._finish(attempt, None, "launch_error", f"agent error: {exc}")
        finally:
            with self._lock:
                self._threads.pop(attempt.key, None)

    def _run_attempt(self, attempt: Attempt) -> None:
        launch = attempt.launch
        assert launch is not None
        with self._lock:
            stopped_before_start = attempt.stop_reason is not None
        if stopped_before_start:
            self._finish_stopped(attempt, None)
            return
        try:
            run = self.launcher.start(launch)
        except Exception as exc:
            log.warning("job %s attempt %s did not start: %s", *attempt.key, exc)
            self._finish(attempt, None, "launch_error", _describe_error(exc))
            return
        with self._lock:
            attempt.run = run
            attempt.started = Started(
                node=self.node,
                job_id=launch.job_id,
                attempt=launch.attempt,
                started_at=self._clock(),
                pid=run.pid,
                container_id=run.container_id,
            )
            stop_now = attempt.stop_reason is not None
        self._send_safely(attempt.started)
        if stop_now:
            run.terminate(attempt.stop_grace_s)
        self._watch(attempt, launch, run)

    def _watch(self, attempt: Attempt, launch: Launch, run: Run) -> None:
        timer = None
        if launch.time_limit_s is not None:
            stop = Stop(
                job_id=launch.job_id,
                attempt=launch.attempt,
                reason="time_limit",
                grace_s=self.kill_grace_s,
            )
            timer = threading.Timer(launch.time_limit_s, self.stop, (stop,))
            timer.daemon = True
            timer.start()
        shipper = LogShipper(lambda seq, text: self._ship_log(launch, seq, text))
        dropped = dropped_user_keys(launch)
        if dropped:
            shipper.text(
                f"[agent] ignored env set by the agent for the slice: {', '.join(dropped)}\n"
            )
        reader = threading.Thread(target=self._read_output, args=(run, shipper), daemon=True)
        reader.start()
        exit_code = run.wait()
        if timer is not None:
            timer.cancel()
        run.reap()
        reader.join(OUTPUT_DRAIN_S)
        run.release()
        if attempt.stop_reason is not None:
            self._finish_stopped(attempt, exit_code)
        elif exit_code == 0:
            self._finish(attempt, 0, "succeeded", "")
        else:
            self._finish(attempt, exit_code, "failed", describe_exit(exit_code))

    def _read_output(self, run: Run, shipper: LogShipper) -> None:
        try:
            for data in run.output():
                shipper.feed(data)
        except Exception:
            log.exception("reading output failed")
        finally:
            shipper.close()

    def _ship_log(self, launch: Launch, seq: int, text: str) -> None:
        self._send_safely(
            LogChunk(
                node=self.node, job_id=launch.job_id, attempt=launch.attempt, seq=seq, data=text
            )
        )

    # --- reports ----------------------------------------------------------------------------

    def _finish_stopped(self, attempt: Attempt, exit_code: int | None) -> None:
        reason = attempt.stop_reason or "cancel"
        note = attempt.stop_note or f"stopped: {reason.replace('_', ' ')}"
        self._finish(attempt, exit_code, OUTCOME_FOR_STOP[reason], note)

    def _finish(self, attempt: Attempt, exit_code: int | None, outcome: str, error: str) -> None:
        with self._lock:
            if attempt.finished is not None:
                return
            attempt.finished = self._finished(
                attempt.key,
                exit_code=exit_code,
                outcome=outcome,
                error=error,
                started_at=attempt.started.started_at if attempt.started else None,
            )
        self._send_safely(attempt.finished)

    def _finished(
        self,
        key: Key,
        *,
        exit_code: int | None,
        outcome: str,
        error: str,
        started_at: float | None = None,
    ) -> Finished:
        return Finished(
            node=self.node,
            job_id=key[0],
            attempt=key[1],
            exit_code=exit_code,
            outcome=outcome,  # type: ignore[arg-type]
            finished_at=self._clock(),
            error=error,
            started_at=started_at,
        )

    def _report_current(self, attempt: Attempt) -> None:
        message = attempt.finished or attempt.started
        if message is not None:  # still starting: `started` follows on its own
            self._send_safely(message)

    def _send_safely(self, message: Message) -> None:
        # A lost report is recovered by heartbeats and re-sent launches; it must not kill
        # the supervision thread.
        try:
            self._send(message)
        except Exception:
            log.exception("sending %s for job %s failed", message.TYPE, message.job_id)  # type: ignore[union-attr]

    def _remember(self, attempt: Attempt) -> Attempt:
        self._attempts[attempt.key] = attempt
        while len(self._attempts) > REMEMBERED_ATTEMPTS:
            oldest_key, oldest = next(iter(self._attempts.items()))
            if oldest.finished is None:
                break  # never forget a running attempt
            del self._attempts[oldest_key]
        return attempt


def _describe_error(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, LaunchError) else f"{type(exc).__name__}: {text}"
