"""`Job`: one job of the portal as an object, with what you do to it as methods."""

from __future__ import annotations

import html
import sys
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from portal_client.client import PortalClient

# Every state a job can be in, and those it never leaves. PREEMPTED and LOST are not final:
# the job goes back to PENDING for another attempt (or ends FAILED).
STATES = frozenset(
    {
        "PENDING",
        "HELD",
        "ASSIGNED",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
        "TIMED_OUT",
        "PREEMPTED",
        "LOST",
    }
)
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"})


class Job:
    """A job as the portal last described it; ``refresh()`` asks again.

    The attributes are the API's fields (docs/api.md) made handy: ``state``, ``reason``,
    ``position``, ``eta`` and ``slice`` say where the job is and why; ``data`` holds the whole
    answer (``job["field"]`` reads it too). A job from ``jobs()`` has the list's fields only
    (no ``slices``, ``events`` or ``command``) until ``refresh()``.
    """

    def __init__(self, client: PortalClient, data: dict[str, Any]) -> None:
        self._client = client
        self.data = data

    # --- what the portal said ----------------------------------------------------------------

    @property
    def id(self) -> int:
        return int(self.data["id"])

    @property
    def name(self) -> str:
        return str(self.data.get("name", ""))

    @property
    def team(self) -> str:
        return str(self.data.get("team", ""))

    @property
    def user(self) -> str:
        return str(self.data.get("user", ""))

    @property
    def state(self) -> str:
        return str(self.data["state"])

    @property
    def attempt(self) -> int:
        return int(self.data.get("attempt") or 0)

    @property
    def pending(self) -> dict[str, Any] | None:
        """The scheduler's explanation while PENDING: code, message, numbers, position, ETA."""
        pending = self.data.get("pending")
        return pending if isinstance(pending, dict) else None

    @property
    def reason_code(self) -> str | None:
        """Why a PENDING job waits, as a code (``QUOTA_LIMIT``, ``NO_FIT``, ...)."""
        return (self.pending or {}).get("code") or None

    @property
    def reason(self) -> str | None:
        """Why the job is where it is: the scheduler's explanation while it waits
        (``QUOTA_LIMIT: team uses 4 of 4 units, job needs 1``), how it ended after."""
        if self.pending is not None:
            code, message = self.pending.get("code"), self.pending.get("message") or ""
            return f"{code}: {message}" if code else message or None
        return str(self.data.get("reason") or "") or None

    @property
    def position(self) -> int | None:
        """Place in the queue while PENDING (1 = next)."""
        return (self.pending or {}).get("position")

    @property
    def eta(self) -> datetime | None:
        """The scheduler's estimate of the start while PENDING, or None when it has none."""
        return parse_time((self.pending or {}).get("estimated_start_at"))

    @property
    def slices(self) -> list[dict[str, Any]]:
        """Where the latest attempt runs or ran (detail only): node, GPU, MIG/MPS, UUIDs."""
        return list(self.data.get("slices") or [])

    @property
    def slice(self) -> str | None:
        """Where it runs, in a few words: ``node-1 GPU 2 mig 1g.10gb`` (several: comma-joined);
        the node alone for a job from the list."""
        if self.slices:
            return ", ".join(_slice_text(item) for item in self.slices)
        return self.data.get("node") or None

    @property
    def exit_code(self) -> int | None:
        return self.data.get("exit_code")

    @property
    def submitted_at(self) -> datetime | None:
        return parse_time(self.data.get("submitted_at"))

    @property
    def started_at(self) -> datetime | None:
        return parse_time(self.data.get("started_at"))

    @property
    def finished_at(self) -> datetime | None:
        return parse_time(self.data.get("finished_at"))

    @property
    def run_time(self) -> timedelta | None:
        """How long it ran (so far, while it runs)."""
        if self.started_at is None:
            return None
        return (self.finished_at or datetime.now(UTC)) - self.started_at

    @property
    def done(self) -> bool:
        """It ended: SUCCEEDED, FAILED, CANCELLED or TIMED_OUT."""
        return self.state in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.state == "SUCCEEDED"

    def __getitem__(self, field: str) -> Any:
        return self.data[field]

    # --- what you do to it -------------------------------------------------------------------

    def refresh(self) -> Job:
        """Ask the portal again; returns this job, updated."""
        self.data = self._client.job(self.id).data
        return self

    def wait(
        self,
        *,
        states: str | Collection[str] = TERMINAL,
        timeout: float | None = 3600.0,
        poll: float = 1.0,
        progress: bool = True,
    ) -> Job:
        """Wait until the job is in one of ``states`` (by default: until it ended), showing
        its state, why it waits, its place, ETA and the time waited (``progress=False``: quiet).

        Raises ``WaitTimeout`` (a ``TimeoutError``) after ``timeout`` seconds, naming the
        state and reason it was last seen in.
        """
        self.data = self._client.wait(
            self.id, states=states, timeout=timeout, poll=poll, progress=progress
        ).data
        return self

    def logs(
        self,
        follow: bool = False,
        *,
        attempt: int | None = None,
        file: IO[str] | None = None,
        poll: float = 1.0,
    ) -> str:
        """The job's output. ``follow=True`` prints it to ``file`` (stdout) as it comes until
        the job ended, and returns all it printed."""
        if not follow:
            return self._client.log(self.id, attempt=attempt)
        out = sys.stdout if file is None else file
        seen: list[str] = []
        for piece in self._client.follow_log(self.id, attempt=attempt, poll=poll):
            out.write(piece)
            out.flush()
            seen.append(piece)
        self.refresh()
        return "".join(seen)

    def cancel(self) -> Job:
        """Cancel: a waiting job ends at once, a running one when its agent stopped it."""
        self.data = self._client.cancel(self.id).data
        return self

    def hold(self) -> Job:
        """Keep a PENDING job from being scheduled until ``release()``."""
        self.data = self._client.hold(self.id).data
        return self

    def release(self) -> Job:
        """Put a HELD job back in the queue (at its end)."""
        self.data = self._client.release(self.id).data
        return self

    def resubmit(self) -> Job:
        """A new job with this (ended) job's request; returns the new one."""
        return self._client.resubmit(self.id)

    # --- how it looks ------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.name!r} {self.state}{_where(self)}>"

    def _repr_html_(self) -> str:
        rows = [
            ("state", f'<b style="color:{_colour(self.state)}">{self.state}</b>'),
            ("team / user", html.escape(f"{self.team} / {self.user}")),
        ]
        if self.reason:
            rows.append(("reason", html.escape(self.reason)))
        if self.position is not None:
            rows.append(("queue position", str(self.position)))
        if self.pending is not None:
            rows.append(("estimated start", html.escape(format_eta(self.eta))))
        if self.slice:
            rows.append(("slice", html.escape(self.slice)))
        if self.exit_code is not None:
            rows.append(("exit code", str(self.exit_code)))
        for label, when in (
            ("submitted", self.submitted_at),
            ("started", self.started_at),
            ("finished", self.finished_at),
        ):
            if when is not None:
                rows.append((label, when.strftime("%Y-%m-%d %H:%M:%S UTC")))
        if self.run_time is not None:
            rows.append(("run time", format_duration(self.run_time)))
        body = "".join(
            f'<tr><th style="text-align:left">{label}</th><td style="text-align:left">{value}'
            "</td></tr>"
            for label, value in rows
        )
        title = html.escape(f"Job {self.id} · {self.name}")
        return f"<table><caption>{title}</caption>{body}</table>"


def status_line(job: Job, *, waited: float | None = None) -> str:
    """One line about where a job is: state, reason code, position, ETA, time waited."""
    parts = [f"job {job.id} {job.state}"]
    if job.state == "PENDING":
        parts.append(job.reason_code or "waiting for a scheduling pass")
        if job.position is not None:
            parts.append(f"position {job.position}")
        parts.append(f"ETA {format_eta(job.eta)}")
    elif job.slice and not job.done:
        parts.append(f"on {job.slice}")
    if job.done and job.exit_code is not None:
        parts.append(f"exit {job.exit_code}")
    if waited is not None:
        parts.append(f"elapsed {format_duration(timedelta(seconds=waited))}")
    return " · ".join(parts)


def parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def format_duration(span: timedelta) -> str:
    seconds = max(0, int(span.total_seconds()))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def format_eta(eta: datetime | None) -> str:
    if eta is None:
        return "unknown"
    left = eta - datetime.now(UTC)
    if left.total_seconds() <= 0:
        return f"{eta:%H:%M:%S} UTC (now)"
    return f"{eta:%H:%M:%S} UTC (in {format_duration(left)})"


def _where(job: Job) -> str:
    if job.state == "PENDING":
        position = f", position {job.position}" if job.position is not None else ""
        return f" ({job.reason_code or 'waiting for a pass'}{position})"
    if job.done:
        ran = f", ran {format_duration(job.run_time)}" if job.run_time is not None else ""
        code = f"exit {job.exit_code}" if job.exit_code is not None else job.reason or "no exit"
        return f" ({code}{ran})"
    return f" on {job.slice}" if job.slice else ""


def _slice_text(item: dict[str, Any]) -> str:
    kind = item.get("kind", "")
    profile = f" {item['profile']}" if item.get("profile") else ""
    return f"{item.get('node', '?')} GPU {item.get('gpu_index', '?')} {kind}{profile}".strip()


def _colour(state: str) -> str:
    if state == "SUCCEEDED":
        return "#1a7f37"
    if state in TERMINAL:
        return "#cf222e"
    return "#9a6700" if state in {"PENDING", "HELD"} else "#0969da"
