"""The agent's memory on its own disk: the outbox of reports and the journal of attempts.

Both survive a crash or a `kill -9` of the agent, so a restarted agent still

- re-sends every report the portal has not acknowledged (at-least-once reporting), and
- knows every attempt it accepted, so it never runs one twice, refuses an attempt older than
  one it has seen (attempt numbers are fencing tokens) and can say "I have no record of that
  attempt" with confidence (the answer that lets the portal requeue it).

Files are written to a temporary name and renamed into place, so a crash leaves the old file
or the new one, never half of one. `started` and `finished` reports and journal entries are
fsynced; log chunks and log marks are not: they are safe from a crash of the agent (the
kernel has them), not from one of the host (the portal then shows the log up to there).

The journal also keeps each attempt's last log mark (`workers/logship.py`): where its log
goes on after a restart.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.logship import LogMark
from workers.protocol import (
    Finished,
    Launch,
    LogChunk,
    ProtocolError,
    Report,
    ReportKey,
    Started,
    parse,
)

log = logging.getLogger(__name__)

ReportId = tuple[str, int, int, int]  # (kind, job_id, attempt, seq)
Key = tuple[int, int]  # (job_id, attempt)

# Sort order inside one attempt: its start, then its output, then its end.
_KIND_ORDER = {"started": 0, "log": 1, "finished": 2}
_REPORT_FILE = re.compile(r"^(\d+)-(\d+)-(started|log|finished)-(\d+)\.json$")
_ATTEMPT_FILE = re.compile(r"^(\d+)-(\d+)\.json$")


def _write_atomically(path: Path, data: bytes, *, durable: bool) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def report_id(report: Report) -> ReportId:
    return report.report_key().as_tuple()


class Outbox:
    """Reports waiting for the portal's acknowledgement, one file each.

    Log chunks of one attempt are kept up to `max_log_bytes` of text; past that the chunk is
    refused (`put` returns False) and the caller says in the log that output was dropped.
    """

    def __init__(self, directory: Path, *, max_log_bytes: int = 64 * 1024 * 1024) -> None:
        self.directory = directory
        self.max_log_bytes = max_log_bytes
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        self._reports: dict[ReportId, Report] = {}
        self._log_bytes: dict[Key, int] = {}
        self._load()

    def _path(self, rid: ReportId) -> Path:
        kind, job_id, attempt, seq = rid
        return self.directory / f"{job_id}-{attempt}-{kind}-{seq}.json"

    def _load(self) -> None:
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith(".tmp-"):
                path.unlink(missing_ok=True)  # a write the crash interrupted
                continue
            if not _REPORT_FILE.match(path.name):
                continue
            try:
                message = parse(json.loads(path.read_bytes()))
            except (OSError, ValueError, ProtocolError) as error:
                log.error("outbox: unreadable %s moved aside: %s", path.name, error)
                path.rename(path.with_suffix(".unreadable"))
                continue
            if isinstance(message, (Started, LogChunk, Finished)):
                self._remember(message)

    def _remember(self, report: Report) -> None:
        self._reports[report_id(report)] = report
        if isinstance(report, LogChunk):
            key = (report.job_id, report.attempt)
            self._log_bytes[key] = self._log_bytes.get(key, 0) + len(report.data.encode())

    def put(self, report: Report) -> bool:
        """Keep `report` until it is acknowledged; a repeat of one already kept is a no-op."""
        rid = report_id(report)
        with self._lock:
            if rid in self._reports:
                return True
            if isinstance(report, LogChunk):
                used = self._log_bytes.get((report.job_id, report.attempt), 0)
                if used + len(report.data.encode()) > self.max_log_bytes:
                    return False
            data = json.dumps(report.to_dict(), separators=(",", ":")).encode()
            _write_atomically(self._path(rid), data, durable=not isinstance(report, LogChunk))
            self._remember(report)
        return True

    def ack(self, keys: Iterable[ReportKey | ReportId]) -> int:
        """Forget acknowledged reports; returns how many were still here."""
        removed = 0
        with self._lock:
            for key in keys:
                rid = key.as_tuple() if isinstance(key, ReportKey) else key
                report = self._reports.pop(rid, None)
                if report is None:
                    continue
                removed += 1
                self._path(rid).unlink(missing_ok=True)
                if isinstance(report, LogChunk):
                    attempt_key = (report.job_id, report.attempt)
                    left = self._log_bytes.get(attempt_key, 0) - len(report.data.encode())
                    if left > 0:
                        self._log_bytes[attempt_key] = left
                    else:
                        self._log_bytes.pop(attempt_key, None)
        return removed

    def pending(self) -> list[Report]:
        """Every unacknowledged report, oldest attempt first, each attempt in order."""
        with self._lock:
            items = list(self._reports.items())
        items.sort(key=lambda kv: (kv[0][1], kv[0][2], _KIND_ORDER[kv[0][0]], kv[0][3]))
        return [report for _, report in items]

    def pending_finished(self) -> list[Finished]:
        with self._lock:
            return [r for r in self._reports.values() if isinstance(r, Finished)]

    def holds(self, rid: ReportId) -> bool:
        with self._lock:
            return rid in self._reports

    def __len__(self) -> int:
        with self._lock:
            return len(self._reports)


@dataclass
class JournalEntry:
    """What this node knows of one attempt: its launch (None for a tombstone: an attempt
    stopped or asked about before any launch arrived), when it started, how it ended."""

    job_id: int
    attempt: int
    launch: Launch | None = None
    started_at: float | None = None
    pid: int | None = None
    container_id: str | None = None
    finished: Finished | None = None

    def to_json(self) -> bytes:
        data: dict[str, Any] = {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "launch": self.launch.to_dict() if self.launch else None,
            "started_at": self.started_at,
            "pid": self.pid,
            "container_id": self.container_id,
            "finished": self.finished.to_dict() if self.finished else None,
        }
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> JournalEntry:
        data = json.loads(raw)
        launch = parse(data["launch"]) if data.get("launch") else None
        finished = parse(data["finished"]) if data.get("finished") else None
        if launch is not None and not isinstance(launch, Launch):
            raise ValueError("launch is not a launch message")
        if finished is not None and not isinstance(finished, Finished):
            raise ValueError("finished is not a finished report")
        return cls(
            job_id=int(data["job_id"]),
            attempt=int(data["attempt"]),
            launch=launch,
            started_at=data.get("started_at"),
            pid=data.get("pid"),
            container_id=data.get("container_id"),
            finished=finished,
        )


class AttemptJournal:
    """One small file per attempt this node accepted, started, ended or refused.

    `highest_attempt(job)` is the fencing token: a launch of an older attempt is refused.
    Entries of ended attempts are kept for `keep_s` (longer than any message may wait in the
    broker: older messages are refused by their signed timestamp anyway) and then pruned.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        self._entries: dict[Key, JournalEntry] = {}
        self._highest: dict[int, int] = {}
        self._load()

    def _path(self, key: Key) -> Path:
        return self.directory / f"{key[0]}-{key[1]}.json"

    def _mark_path(self, key: Key) -> Path:
        return self.directory / f"{key[0]}-{key[1]}.log-mark"

    def _load(self) -> None:
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith(".tmp-"):
                path.unlink(missing_ok=True)
                continue
            if not _ATTEMPT_FILE.match(path.name):
                continue
            try:
                entry = JournalEntry.from_json(path.read_bytes())
            except (OSError, ValueError, KeyError, ProtocolError) as error:
                log.error("journal: unreadable %s moved aside: %s", path.name, error)
                path.rename(path.with_suffix(".unreadable"))
                continue
            self._index(entry)

    def _index(self, entry: JournalEntry) -> None:
        self._entries[(entry.job_id, entry.attempt)] = entry
        if entry.attempt > self._highest.get(entry.job_id, -1):
            self._highest[entry.job_id] = entry.attempt

    def _save(self, entry: JournalEntry) -> None:
        _write_atomically(self._path((entry.job_id, entry.attempt)), entry.to_json(), durable=True)
        self._index(entry)

    def get(self, key: Key) -> JournalEntry | None:
        with self._lock:
            return self._entries.get(key)

    def highest_attempt(self, job_id: int) -> int | None:
        with self._lock:
            return self._highest.get(job_id)

    def record_launch(self, launch: Launch) -> None:
        with self._lock:
            self._save(JournalEntry(job_id=launch.job_id, attempt=launch.attempt, launch=launch))

    def record_started(
        self, key: Key, *, at: float, pid: int | None, container: str | None
    ) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry.started_at, entry.pid, entry.container_id = at, pid, container
            self._save(entry)

    def record_finished(self, finished: Finished) -> None:
        """The attempt ended (or, with no entry yet, a tombstone: it must never run)."""
        key = (finished.job_id, finished.attempt)
        with self._lock:
            entry = self._entries.get(key) or JournalEntry(job_id=key[0], attempt=key[1])
            if entry.finished is None:
                entry.finished = finished
                self._save(entry)

    def record_log(self, key: Key, mark: LogMark) -> None:
        """The attempt's log chunk about to be sent (written before the outbox has it)."""
        data = {"seq": mark.seq, "start": mark.start, "end": mark.end, "note": mark.note}
        _write_atomically(
            self._mark_path(key), json.dumps(data, separators=(",", ":")).encode(), durable=False
        )

    def log_mark(self, key: Key) -> LogMark | None:
        """The attempt's last log mark; None before its first chunk (or if unreadable: the
        log then starts again from its first byte, and the portal keeps the chunks it has)."""
        try:
            data = json.loads(self._mark_path(key).read_bytes())
            note = data["note"]
            return LogMark(
                seq=int(data["seq"]),
                start=int(data["start"]),
                end=int(data["end"]),
                note=None if note is None else str(note),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.error("journal: unreadable log mark of job %s attempt %s: %s", *key, error)
            return None

    def unfinished(self) -> list[JournalEntry]:
        """Attempts launched here that have no end recorded (a restart's work list)."""
        with self._lock:
            return [e for e in self._entries.values() if e.launch is not None and not e.finished]

    def prune(self, *, now: float, keep_s: float, keep: set[Key]) -> int:
        """Forget ended attempts older than `keep_s`, except `keep` (reports still unacked)."""
        removed = 0
        with self._lock:
            for key, entry in list(self._entries.items()):
                ended = entry.finished
                if ended is None or key in keep or now - ended.finished_at < keep_s:
                    continue
                del self._entries[key]
                self._path(key).unlink(missing_ok=True)
                self._mark_path(key).unlink(missing_ok=True)
                removed += 1
            self._highest = {}
            for job_id, attempt in self._entries:
                if attempt > self._highest.get(job_id, -1):
                    self._highest[job_id] = attempt
        return removed
