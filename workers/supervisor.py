"""The agent's job bookkeeping: launch, stop and query handling, supervision, reports.

No Celery here: the agent's tasks call `Supervisor.launch` / `stop` / `query`, and every
report goes through `report(message)`, which keeps it in the outbox until the portal
acknowledges it, so tests drive the supervisor with a recording reporter.

Exactly once, from the agent's side:

- Idempotent by (job_id, attempt): a repeated launch of an attempt this node knows (in memory
  or in its journal on disk) starts nothing and re-reports where it is.
- Attempt numbers are fencing tokens: a launch older than the newest attempt this node saw of
  the job is refused (`superseded`); a newer one first stops an older attempt still running
  here and waits for it to end, so two attempts of one job never overlap on a node.
- A stop or a query for an attempt never seen leaves a tombstone in the journal: a launch
  that arrives after it never starts it.
- `fence()` stops every attempt when the agent lost its lease (reported `fenced`); the
  launch gate (`may_launch`) keeps new ones out until the lease is back.
- A stop is recorded before any run is signalled (for a fence or a shutdown: every stop,
  then every signal), so a run that dies while others are being signalled is still reported
  with the stop's outcome. A run that had exited on its own before the stop was recorded keeps
  its own outcome: reporting a job that finished by itself as stopped would have the portal
  run it again.
- `lose_slices()` when the inventory changed under running attempts (a GPU lost, a new MIG
  layout: workers.hardware): each attempt on a slice that is gone is stopped and reported
  `lost` with the reason (GPU_LOST: ..., MIG_RECONFIGURED: ...), unless it had ended on its
  own first; a launch onto such a slice is not started (`SliceGone`, also `lost`). An attempt
  that exits with an error is checked against the inventory first (`slice_gone`), so a job
  whose GPU fell off the bus under it is reported lost, not failed.
- `recover()` after a restart: attempts the journal says were running are adopted again when
  the launcher still has them (containers; processes that ended on their own), otherwise
  reported `lost`. An adopted run's log goes on from the journal's last log mark
  (`workers/logship.py`), so no output is lost or shipped twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from workers.launch import LaunchError, LeaseLapsed, SliceGone, dropped_user_keys
from workers.launchers import Launcher, Run, describe_exit
from workers.logship import LogShipper
from workers.outbox import AttemptJournal, JournalEntry
from workers.protocol import (
    Finished,
    Launch,
    LogChunk,
    Query,
    Report,
    RunningAttempt,
    Started,
    Stop,
)

log = logging.getLogger(__name__)

# Why an attempt was stopped -> the outcome reported. "fence" and "shutdown" are the agent's
# own reasons; the others come with a stop message.
OUTCOME_FOR_STOP = {
    "cancel": "cancelled",
    "preempt": "preempted",
    "time_limit": "timed_out",
    "fence": "fenced",
    "shutdown": "preempted",
    "superseded": "preempted",
    "hardware": "lost",
}
# Attempts kept in memory once ended (the journal on disk remembers longer).
REMEMBERED_ATTEMPTS = 10_000
# How long to wait for the rest of the output once the attempt exited.
OUTPUT_DRAIN_S = 10.0

Key = tuple[int, int]
Reporter = Callable[[Report], bool]


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
    log_chunks: int = 0
    lease_epoch: int | None = None  # the agent's lease epoch it was accepted in


class Supervisor:
    def __init__(
        self,
        *,
        node: str,
        launcher: Launcher,
        report: Reporter,
        journal: AttemptJournal,
        kill_grace_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        slice_gone: Callable[[Launch], str | None] = lambda launch: None,
        lease_epoch: Callable[[], int | None] = lambda: 0,
    ) -> None:
        self.node = node
        self.launcher = launcher
        self._report = report
        self.journal = journal
        self.kill_grace_s = kill_grace_s
        self._clock = clock
        # The agent's lease epoch while it holds its lease, None when it does not (nothing
        # may launch then); a launch is handed the epoch it was accepted in (workers.lease).
        self._lease_epoch = lease_epoch
        # Why one of the launch's slices is no longer on the node (None: all are there).
        self._slice_gone = slice_gone
        self._lock = threading.Lock()
        self._attempts: OrderedDict[Key, Attempt] = OrderedDict()
        self._threads: dict[Key, threading.Thread] = {}
        self._shutting_down = False

    # --- handlers (called from the agent's Celery tasks) ------------------------------------

    def launch(self, msg: Launch) -> None:
        """Start the attempt on a supervision thread and return at once."""
        key = (msg.job_id, msg.attempt)
        older: list[Attempt] = []
        with self._lock:
            # Known in memory, or in the journal (ended in an earlier run of the agent, or a
            # tombstone): never run again.
            attempt = self._recall(key)
            if attempt is None:
                highest = self.journal.highest_attempt(msg.job_id)
                if highest is not None and msg.attempt < highest:
                    attempt = self._tombstone(
                        key,
                        "superseded",
                        f"attempt {highest} of this job was seen on {self.node} first",
                    )
                elif self._shutting_down or (epoch := self._lease_epoch()) is None:
                    log.warning(
                        "job %s attempt %s: launch refused (%s); the portal sends it again",
                        *key,
                        "agent shutting down" if self._shutting_down else "no lease",
                    )
                    return
                else:
                    self.journal.record_launch(msg)
                    attempt = self._remember(Attempt(key=key, launch=msg, lease_epoch=epoch))
                    # Older attempts of this job still running here stop first (fencing).
                    older = [
                        a
                        for a in self._attempts.values()
                        if a.key[0] == msg.job_id and a.key[1] < msg.attempt and a.run
                    ]
                    thread = threading.Thread(
                        target=self._supervise,
                        args=(attempt, older),
                        name=f"job-{key[0]}-{key[1]}",
                    )
                    self._threads[key] = thread
                    thread.start()
                    return
        log.info("job %s attempt %s launched again: re-reporting its state", *key)
        self._report_current(attempt)

    def stop(self, msg: Stop) -> None:
        self._stop(msg.job_id, msg.attempt, msg.reason, msg.grace_s, note="")

    def _stop(self, job_id: int, attempt_no: int, reason: str, grace_s: float, note: str) -> None:
        key = (job_id, attempt_no)
        to_terminate: list[tuple[Run, float]] = []
        with self._lock:
            attempt = self._recall(key)
            if attempt is None:
                attempt = self._tombstone(
                    key,
                    OUTCOME_FOR_STOP[reason],
                    f"stopped ({reason}) before it started on {self.node}",
                )
            else:
                to_terminate = self._request_stop(attempt, reason, grace_s, note)
            finished = attempt.finished
        _terminate(to_terminate)
        if finished is not None:
            self._report(finished)

    def _request_stop(
        self, attempt: Attempt, reason: str, grace_s: float, note: str
    ) -> list[tuple[Run, float]]:
        """Record the stop (under the lock); the run to signal once the lock is released, if
        any. The first stop of an attempt wins. A run that has exited already keeps its own
        outcome: it ended before anything was asked of it, and reporting a finished job as
        stopped would have the portal run it again. A starting attempt has no run yet: its
        thread sees stop_reason instead."""
        if attempt.finished is not None or attempt.stop_reason is not None:
            return []
        run = attempt.run
        if run is not None and run.has_exited():
            return []
        attempt.stop_reason = reason
        attempt.stop_grace_s = grace_s
        attempt.stop_note = note
        if run is None:
            return []
        return [(run, grace_s)]

    def query(self, msg: Query) -> None:
        """Re-report what this node knows of the attempt; with no record of it, say so
        (`unknown`) and make sure it never runs here."""
        key = (msg.job_id, msg.attempt)
        with self._lock:
            attempt = self._recall(key) or self._tombstone(
                key, "unknown", f"{self.node} has no record of this attempt; it will not run it"
            )
        self._report_current(attempt)

    def fence(self, why: str, grace_s: float) -> int:
        """Stop every running attempt now (the lease lapsed); returns how many. Every stop is
        recorded before the first run is signalled: an attempt whose run ends meanwhile, for
        whatever reason, is still reported `fenced`."""
        with self._lock:
            fenced = [
                a for a in self._attempts.values() if a.launch is not None and a.finished is None
            ]
            to_terminate = [
                pending
                for attempt in fenced
                for pending in self._request_stop(attempt, "fence", grace_s, f"fenced: {why}")
            ]
        _terminate(to_terminate)
        return len(fenced)

    def lose_slices(self, gone: Mapping[str, str], grace_s: float) -> list[Key]:
        """Stop every attempt that runs on a slice in `gone` (slice key -> why), to be reported
        `lost` with the reason of its first such slice; returns their keys. As for a fence,
        every stop is recorded before a run is signalled, and a run that had ended on its own
        keeps its own outcome."""
        with self._lock:
            hit: list[tuple[Attempt, str]] = []
            for attempt in self._attempts.values():
                if attempt.launch is None or attempt.finished is not None:
                    continue
                why = next(
                    (gone[d.slice_id] for d in attempt.launch.devices if d.slice_id in gone), None
                )
                if why is not None:
                    hit.append((attempt, why))
            to_terminate = [
                pending
                for attempt, why in hit
                for pending in self._request_stop(attempt, "hardware", grace_s, why)
            ]
        _terminate(to_terminate)
        return [attempt.key for attempt, _ in hit]

    def running(self) -> list[RunningAttempt]:
        """Attempts accepted here and not finished: the heartbeat's `running` list."""
        with self._lock:
            return [
                _running_attempt(a)
                for a in self._attempts.values()
                if a.launch is not None and a.finished is None
            ]

    def running_launches(self) -> list[tuple[Launch, RunningAttempt]]:
        """The attempts that have started and not finished, with their launch messages (for
        GPU metrics)."""
        with self._lock:
            return [
                (a.launch, _running_attempt(a))
                for a in self._attempts.values()
                if a.launch is not None and a.started is not None and a.finished is None
            ]

    def recover(self, adopted: Mapping[Key, Run]) -> None:
        """After a restart: supervise the attempts the launcher still has (`adopted`), and
        report the other attempts the journal says were running as `lost`."""
        for entry in self.journal.unfinished():
            key = (entry.job_id, entry.attempt)
            assert entry.launch is not None
            run = adopted.get(key)
            with self._lock:
                attempt = self._remember(Attempt(key=key, launch=entry.launch))
                if entry.started_at is not None:
                    attempt.started = Started(
                        node=self.node,
                        job_id=key[0],
                        attempt=key[1],
                        started_at=entry.started_at,
                        pid=entry.pid,
                        container_id=entry.container_id,
                    )
            if run is None:
                log.warning("job %s attempt %s did not survive the agent's restart", *key)
                self._finish(
                    attempt,
                    None,
                    "lost",
                    f"the agent on {self.node} restarted and the attempt did not survive it",
                )
                continue
            log.info("job %s attempt %s adopted again after the agent's restart", *key)
            thread = threading.Thread(
                target=self._supervise_adopted, args=(attempt, run), name=f"job-{key[0]}-{key[1]}"
            )
            with self._lock:
                attempt.run = run
                self._threads[key] = thread
            thread.start()

    def shutdown(self, grace_s: float | None = None) -> None:
        """Stop every running attempt (reported as preempted, so the portal requeues it)
        and wait for their supervision threads."""
        grace = self.kill_grace_s if grace_s is None else grace_s
        with self._lock:
            self._shutting_down = True
            note = f"agent on {self.node} shut down"
            to_terminate = [
                pending
                for attempt in self._attempts.values()
                for pending in self._request_stop(attempt, "shutdown", grace, note)
            ]
            threads = list(self._threads.values())
        _terminate(to_terminate)
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

    def _supervise(self, attempt: Attempt, older: list[Attempt]) -> None:
        try:
            self._end_older(attempt, older)
            self._run_attempt(attempt)
        except Exception as exc:  # never leave an attempt without a `finished`
            log.exception("supervising job %s attempt %s failed", *attempt.key)
            self._finish(attempt, None, "launch_error", f"agent error: {exc}")
        finally:
            with self._lock:
                self._threads.pop(attempt.key, None)

    def _supervise_adopted(self, attempt: Attempt, run: Run) -> None:
        try:
            assert attempt.launch is not None
            self._watch(attempt, attempt.launch, run)
        except Exception as exc:
            log.exception("supervising adopted job %s attempt %s failed", *attempt.key)
            self._finish(attempt, None, "lost", f"agent error after adoption: {exc}")
        finally:
            with self._lock:
                self._threads.pop(attempt.key, None)

    def _end_older(self, attempt: Attempt, older: list[Attempt]) -> None:
        """A newer attempt of the same job arrived: the older one stops first, and the new one
        starts only once it has ended."""
        for old in older:
            log.warning(
                "job %s: attempt %s superseded by attempt %s",
                old.key[0],
                old.key[1],
                attempt.key[1],
            )
            self._stop(
                *old.key,
                "superseded",
                self.kill_grace_s,
                note=f"superseded by attempt {attempt.key[1]}",
            )
            with self._lock:
                thread = self._threads.get(old.key)
            if thread is not None:
                thread.join(self.kill_grace_s + OUTPUT_DRAIN_S)

    def _run_attempt(self, attempt: Attempt) -> None:
        launch = attempt.launch
        assert launch is not None
        with self._lock:
            stopped_before_start = attempt.stop_reason is not None
        if stopped_before_start:
            self._finish_stopped(attempt, None)
            return
        try:
            run = self.launcher.start(launch, lease_epoch=attempt.lease_epoch)
        except LeaseLapsed as exc:
            log.warning("job %s attempt %s not started: %s", *attempt.key, exc)
            self._finish(attempt, None, "fenced", str(exc))
            return
        except SliceGone as exc:
            log.warning("job %s attempt %s not started: %s", *attempt.key, exc)
            self._finish(attempt, None, "lost", str(exc))
            return
        except Exception as exc:
            log.warning("job %s attempt %s did not start: %s", *attempt.key, exc)
            self._finish(attempt, None, "launch_error", _describe_error(exc))
            return
        started = Started(
            node=self.node,
            job_id=launch.job_id,
            attempt=launch.attempt,
            started_at=self._clock(),
            pid=run.pid,
            container_id=run.container_id,
        )
        self.journal.record_started(
            attempt.key, at=started.started_at, pid=run.pid, container=run.container_id
        )
        with self._lock:
            attempt.run = run
            attempt.started = started
            stop_now = attempt.stop_reason is not None
        self._report(started)
        if stop_now:
            run.terminate(attempt.stop_grace_s)
        self._watch(attempt, launch, run)

    def _watch(self, attempt: Attempt, launch: Launch, run: Run) -> None:
        timer = None
        if launch.time_limit_s is not None:
            started_at = attempt.started.started_at if attempt.started else self._clock()
            left = max(0.0, launch.time_limit_s - (self._clock() - started_at))
            stop = Stop(
                node=self.node,
                job_id=launch.job_id,
                attempt=launch.attempt,
                reason="time_limit",
                grace_s=self.kill_grace_s,
            )
            timer = threading.Timer(left, self.stop, (stop,))
            timer.daemon = True
            timer.start()
        shipper = LogShipper(
            lambda seq, text: self._ship_log(launch, seq, text),
            lambda mark: self.journal.record_log(attempt.key, mark),
        )
        resume = self.journal.log_mark(attempt.key)
        if resume is not None:
            # An earlier run of the agent shipped the log up to here (an adopted run).
            shipper.resume(resume)
        else:
            dropped = dropped_user_keys(launch)
            if dropped:
                shipper.note(
                    f"[agent] ignored env set by the agent for the slice: {', '.join(dropped)}\n"
                )
            # What the launcher did not do as asked (the process launcher: the image).
            for note in getattr(run, "notes", ()):
                shipper.note(str(note))
        reader = threading.Thread(target=self._read_output, args=(run, shipper), daemon=True)
        reader.start()
        exit_code = run.wait()
        if timer is not None:
            timer.cancel()
        run.reap()
        reader.join(OUTPUT_DRAIN_S)
        attempt.log_chunks = shipper.seq
        fenced = _fenced_reason(run)
        lost = _lost_reason(run)
        if exit_code != 0 and not lost and attempt.stop_reason is None:
            # Did it fail on its own because its GPU went (a CUDA error before the agent
            # noticed)? The inventory is read again now, outside the lock: it may stop other
            # attempts. (A stopped attempt's outcome is its stop's: nothing to read.)
            lost = self._slice_gone(launch)
        stop_reached = _stop_reached(run)
        note = str(getattr(run, "end_note", ""))
        run.release()

        def outcome() -> tuple[str, str]:
            # Decided under the lock that records stops: a stop recorded before this is
            # the outcome, one after it finds the attempt finished.
            if fenced and attempt.stop_reason is None:
                # The job's own watcher stopped it (the agent was frozen or slow to notice).
                attempt.stop_reason = "fence"
                attempt.stop_note = f"fenced: {fenced}"
            if attempt.stop_reason is not None and (fenced or stop_reached):
                return _stopped_outcome(attempt)
            if lost:
                # What it ran on failed under it (its GPU's MPS daemon died, its GPU fell off
                # the bus): not its result.
                return "lost", lost
            # It ended on its own, even if a stop was asked for meanwhile: its result stands
            # (reporting a finished job as stopped would run it again).
            if exit_code == 0:
                return "succeeded", note
            return "failed", describe_exit(exit_code) + (f"; {note}" if note else "")

        self._finish_as(attempt, exit_code, outcome)

    def _read_output(self, run: Run, shipper: LogShipper) -> None:
        try:
            for data in run.output(shipper.offset):
                shipper.feed(data)
        except Exception:
            log.exception("reading output failed")
        finally:
            shipper.close()

    def _ship_log(self, launch: Launch, seq: int, text: str) -> bool:
        return self._report(
            LogChunk(
                node=self.node, job_id=launch.job_id, attempt=launch.attempt, seq=seq, data=text
            )
        )

    # --- reports ----------------------------------------------------------------------------

    def _finish_stopped(self, attempt: Attempt, exit_code: int | None) -> None:
        self._finish_as(attempt, exit_code, lambda: _stopped_outcome(attempt))

    def _finish(self, attempt: Attempt, exit_code: int | None, outcome: str, error: str) -> None:
        self._finish_as(attempt, exit_code, lambda: (outcome, error))

    def _finish_as(
        self,
        attempt: Attempt,
        exit_code: int | None,
        decide: Callable[[], tuple[str, str]],
    ) -> None:
        """Record and report the attempt's end once; `decide()` gives (outcome, error) and
        runs under the lock, so no stop can slip in between the decision and the record."""
        with self._lock:
            if attempt.finished is not None:
                return
            outcome, error = decide()
            attempt.finished = self._finished(
                attempt.key,
                exit_code=exit_code,
                outcome=outcome,
                error=error,
                started_at=attempt.started.started_at if attempt.started else None,
                log_chunks=attempt.log_chunks,
            )
            finished = attempt.finished
        # Journal first: once the report may leave, a restart must know the attempt ended.
        self.journal.record_finished(finished)
        self._report(finished)

    def _finished(
        self,
        key: Key,
        *,
        exit_code: int | None,
        outcome: str,
        error: str,
        started_at: float | None = None,
        log_chunks: int = 0,
    ) -> Finished:
        return Finished(
            node=self.node,
            job_id=key[0],
            attempt=key[1],
            exit_code=exit_code,
            outcome=outcome,  # type: ignore[arg-type]
            finished_at=self._clock(),
            error=error[:2000],
            started_at=started_at,
            log_chunks=log_chunks,
        )

    def _report_current(self, attempt: Attempt) -> None:
        message = attempt.finished or attempt.started
        if message is not None:  # still starting: `started` follows on its own
            self._report(message)

    def _recall(self, key: Key) -> Attempt | None:
        """Under the lock: what this node knows of an attempt, in memory or in its journal."""
        attempt = self._attempts.get(key)
        if attempt is None:
            known = self.journal.get(key)
            if known is not None:
                attempt = self._remember(_from_journal(known))
        return attempt

    def _tombstone(self, key: Key, outcome: str, error: str) -> Attempt:
        """Under the lock: an attempt this node never ran and now never will. Its end goes to
        the journal at once, so a launch arriving later finds it."""
        attempt = self._remember(Attempt(key=key, launch=None))
        attempt.finished = self._finished(key, exit_code=None, outcome=outcome, error=error)
        self.journal.record_finished(attempt.finished)
        return attempt

    def _remember(self, attempt: Attempt) -> Attempt:
        self._attempts[attempt.key] = attempt
        while len(self._attempts) > REMEMBERED_ATTEMPTS:
            oldest_key, oldest = next(iter(self._attempts.items()))
            if oldest.finished is None:
                break  # never forget a running attempt
            del self._attempts[oldest_key]
        return attempt


def _stopped_outcome(attempt: Attempt) -> tuple[str, str]:
    reason = attempt.stop_reason or "cancel"
    return OUTCOME_FOR_STOP[reason], attempt.stop_note or f"stopped: {reason.replace('_', ' ')}"


def _terminate(runs: list[tuple[Run, float]]) -> None:
    """Signal runs whose stops were recorded (outside the lock: a launcher may block)."""
    for run, grace_s in runs:
        run.terminate(grace_s)


def _from_journal(entry: JournalEntry) -> Attempt:
    attempt = Attempt(key=(entry.job_id, entry.attempt), launch=entry.launch)
    attempt.finished = entry.finished
    return attempt


def _fenced_reason(run: Run) -> str | None:
    fenced = getattr(run, "fenced", None)
    return fenced() if callable(fenced) else None


def _running_attempt(attempt: Attempt) -> RunningAttempt:
    started = attempt.started
    return RunningAttempt(
        job_id=attempt.key[0],
        attempt=attempt.key[1],
        started_at=started.started_at if started else None,
        pid=started.pid if started else None,
        container_id=started.container_id if started else None,
    )


def _lost_reason(run: Run) -> str | None:
    lost = getattr(run, "lost", None)
    return lost() if callable(lost) else None


def _stop_reached(run: Run) -> bool:
    """Whether a stop signal reached the attempt while it ran; True for a launcher that
    cannot tell (its stop outcome then stands, as before)."""
    reached = getattr(run, "stop_reached", None)
    return bool(reached()) if callable(reached) else True


def _describe_error(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, LaunchError) else f"{type(exc).__name__}: {text}"
