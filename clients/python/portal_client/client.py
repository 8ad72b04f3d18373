"""`PortalClient`: the portal's REST API (docs/api.md) as typed methods over httpx."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator
from datetime import date
from functools import partial
from typing import Any, Required, TypedDict, TypeVar, Unpack
from urllib.parse import parse_qsl, urlsplit

import httpx

from portal_client.config import load_settings
from portal_client.errors import PortalUnavailable, RateLimited, WaitTimeout, error_for
from portal_client.jobs import STATES, TERMINAL, Job
from portal_client.progress import WaitProgress

__version__ = "0.2.0"
T = TypeVar("T")

# Retries of idempotent calls: after 0.5, 1, 2, 4 s (a Retry-After the portal sends wins,
# up to MAX_RETRY_WAIT_S).
DEFAULT_RETRIES = 4
DEFAULT_BACKOFF_S = 0.5
MAX_RETRY_WAIT_S = 30.0
RETRY_STATUSES = frozenset({502, 503, 504})


class GpuRequest(TypedDict, total=False):
    """What a job runs on: ``kind`` is ``whole``, ``mig`` (needs ``profile``) or ``mps``."""

    kind: Required[str]
    count: int
    min_count: int
    profile: str
    model: str
    multi_node: bool


class Dependency(TypedDict):
    """Start after job ``job``: ``kind`` is ``after_ok`` (it succeeded) or ``after_any``."""

    job: int
    kind: str


class ArraySpec(TypedDict, total=False):
    """A job array: ``count`` members, or one per combination of ``values`` (NAME: [value,
    ...], set as env variables), at most ``max_running`` of them running at once."""

    count: int
    values: dict[str, list[str | int | float | bool]]
    max_running: int


class JobRequest(TypedDict, total=False):
    """The body of ``POST /api/v1/jobs/``; the portal checks it and names any bad field."""

    name: Required[str]
    team: Required[str]
    image: Required[str]
    command: Required[list[str] | str]
    gpu: Required[GpuRequest]
    env: dict[str, str]
    priority: str
    time_limit_s: int
    preemptible: bool
    depends_on: list[Dependency]
    notify: list[str] | None  # events of this job to be told about: start, end, fail, preempt


class PortalClient:
    """The portal's REST API with one user's token.

    ``url`` is the portal's address (``http://127.0.0.1:8000/``; one ending in ``/api/v1``
    works too); ``token`` comes from ``manage.py issue_token <username>`` or the Tokens page.
    Reads (and cancel, hold, release, which change nothing when repeated) are retried with
    backoff on 502/503/504 and on connection errors, ``retries`` times; a submit or a resubmit
    never is (a repeat could make a second job).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retries: int = DEFAULT_RETRIES,
        backoff: float = DEFAULT_BACKOFF_S,
    ) -> None:
        base = url.strip().rstrip("/")
        self.url = base.removesuffix("/api/v1")
        self.api = self.url + "/api/v1"
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._http = httpx.Client(
            headers={
                "Authorization": f"Token {token}",
                # JSON for everything, the log and errors included (text/plain otherwise).
                "Accept": "application/json",
                "User-Agent": f"gpu-portal-client/{__version__}",
            },
            timeout=timeout,
        )

    @classmethod
    def from_env(cls, **options: Any) -> PortalClient:
        """A client for ``PORTAL_URL`` with ``PORTAL_TOKEN``; what is not set there comes from
        the file ``gpu-portal login`` wrote (``~/.config/gpu-portal/config.json``)."""
        settings = load_settings()
        return cls(settings.url, settings.token, **options)

    def __repr__(self) -> str:
        return f"PortalClient({self.url!r})"  # never the token: reprs end up in notebooks

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PortalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- jobs --------------------------------------------------------------------------------

    def submit(self, **job: Unpack[JobRequest]) -> Job:
        """Submit a job; returns it (``state`` PENDING or later). Never retried."""
        if "array" in job:
            raise TypeError("submit() makes one job; for a job array use submit_array()")
        return Job(self, self._call("POST", "/jobs/", body=dict(job), retry=False))

    def submit_array(self, array: ArraySpec, **job: Unpack[JobRequest]) -> dict[str, Any]:
        """Submit a job array (``array={"count": 10, "max_running": 4}`` or ``{"values":
        {"lr": [0.1, 0.01]}}``); returns it: ``id``, ``job_ids`` (by index), ``counts`` by
        state, ``jobs``. Each job gets ``PORTAL_ARRAY_INDEX``. Never retried."""
        body = {**job, "array": dict(array)}
        return dict(self._call("POST", "/jobs/", body=body, retry=False))

    def array(self, array_id: int) -> dict[str, Any]:
        """A job array: its members' ids (by index) and states, and counts by state."""
        return dict(self._call("GET", f"/arrays/{array_id}/"))

    def cancel_array(self, array_id: int) -> dict[str, Any]:
        """Cancel every member of an array that has not ended; ``cancelled`` lists them."""
        return dict(self._call("POST", f"/arrays/{array_id}/cancel/"))

    def resubmit_failed(self, array_id: int) -> dict[str, Any]:
        """A new job for each member that FAILED or TIMED_OUT, at its index; ``resubmitted``
        lists them (index, from_job, job). Never retried."""
        return dict(self._call("POST", f"/arrays/{array_id}/resubmit-failed/", retry=False))

    def job(self, job_id: int) -> Job:
        """One job: state, why it waits, exit code, slices, events."""
        return Job(self, self._call("GET", f"/jobs/{job_id}/"))

    def jobs(
        self,
        state: str | Iterable[str] | None = None,
        team: str | None = None,
        *,
        limit: int | None = None,
    ) -> list[Job]:
        """The jobs of my teams, newest first, optionally only in ``state`` (one or several)
        or of ``team``; all of them (page after page), or the newest ``limit``."""
        query: dict[str, str] = {}
        if state:
            query["state"] = state if isinstance(state, str) else ",".join(state)
        if team:
            query["team"] = team
        if limit is not None:
            query["limit"] = str(min(limit, 500))
        found: dict[int, dict[str, Any]] = {}
        while True:
            page = self._call("GET", "/jobs/", query=query)
            # Pages are walked by cursor (the next link), so none repeats a job; kept once
            # by id all the same.
            for data in page["results"]:
                found.setdefault(data["id"], data)
            if not page.get("next") or (limit is not None and len(found) >= limit):
                break
            # Only the next link's query (the filters, limit and cursor): behind a proxy the
            # absolute link the server builds may name a host this client cannot reach.
            query = dict(parse_qsl(urlsplit(page["next"]).query))
        jobs = [Job(self, data) for data in found.values()]
        return jobs if limit is None else jobs[:limit]

    def log(self, job_id: int, attempt: int | None = None) -> str:
        """A job's whole output so far, of its latest attempt or of ``attempt``."""
        query = {} if attempt is None else {"attempt": str(attempt)}
        return str(self._call("GET", f"/jobs/{job_id}/log/", query=query)["log"])

    def log_after(self, job_id: int, offset: int, attempt: int | None = None) -> dict[str, Any]:
        """The output after byte ``offset``: ``{"log", "next_offset", "ended", "attempt",
        "state", ...}``; read on from ``next_offset`` until ``ended``."""
        query = {"offset": str(offset)}
        if attempt is not None:
            query["attempt"] = str(attempt)
        return dict(self._call("GET", f"/jobs/{job_id}/log/", query=query))

    def follow_log(
        self, job_id: int, *, attempt: int | None = None, poll: float = 1.0
    ) -> Iterator[str]:
        """Yield a job's output as it comes, until the job ended.

        Follows the latest attempt, and the next ones when the job is requeued (with a line
        ``[gpu-portal] job N requeued: attempt M`` between them); only ``attempt`` when given.
        """
        piece = self._patiently(partial(self.log_after, job_id, 0, attempt))
        current = int(piece["attempt"])
        while current == 0 and not piece["ended"]:  # the job has not started a first attempt
            time.sleep(poll)
            piece = self._patiently(partial(self.log_after, job_id, 0, None))
            if int(piece["attempt"]) > 0:  # read from the first one (the job may be past it)
                current = 1
                piece = self._patiently(partial(self.log_after, job_id, 0, current))
        while True:
            if piece["log"]:
                yield str(piece["log"])
            if piece["ended"]:
                if attempt is not None or piece["state"] in TERMINAL:
                    return
                current += 1  # the attempt ended and the job went on to another
                yield f"\n[gpu-portal] job {job_id} requeued: attempt {current}\n"
                offset = 0
            else:
                offset = int(piece["next_offset"])
                if not piece["log"]:
                    time.sleep(poll)
            piece = self._patiently(partial(self.log_after, job_id, offset, current))

    def wait(
        self,
        job_id: int,
        *,
        states: str | Collection[str] = TERMINAL,
        timeout: float | None = 3600.0,
        poll: float = 1.0,
        progress: bool = True,
    ) -> Job:
        """Poll a job every ``poll`` seconds until it is in one of ``states``; returns it.

        Shows the job's state, pending reason code, queue position, ETA and the time waited
        on one updating line (a widget in a notebook); ``progress=False`` shows nothing.
        Raises ``WaitTimeout`` (a ``TimeoutError``) after ``timeout`` seconds (None: as long
        as it takes), naming the state and reason the job was last seen in.
        """
        wanted = {states} if isinstance(states, str) else set(states)
        unknown = sorted(wanted - STATES)
        if unknown or not wanted:
            raise ValueError(
                f"states: unknown {', '.join(unknown) or 'nothing given'}; "
                f"allowed: {', '.join(sorted(STATES))}"
            )
        started = time.monotonic()
        line = WaitProgress(enabled=progress)
        try:
            while True:
                job = self._patiently(partial(self.job, job_id))
                waited = time.monotonic() - started
                line.show(job, waited=waited)
                if job.state in wanted:
                    return job
                if timeout is not None and waited >= timeout:
                    why = f" ({job.reason})" if job.reason else ""
                    raise WaitTimeout(
                        f"job {job_id} still {job.state}{why} after {timeout:g} s "
                        f"(waited for {', '.join(sorted(wanted))})",
                        job,
                    )
                time.sleep(poll if timeout is None else min(poll, timeout - waited))
        finally:
            line.close()

    def cancel(self, job_id: int) -> Job:
        """Cancel a job: a waiting one at once, a running one when its agent has stopped it."""
        return Job(self, self._call("POST", f"/jobs/{job_id}/cancel/"))

    def hold(self, job_id: int) -> Job:
        """Keep a PENDING job from being scheduled until it is released."""
        return Job(self, self._call("POST", f"/jobs/{job_id}/hold/"))

    def release(self, job_id: int) -> Job:
        """Put a HELD job back in the queue (at its end)."""
        return Job(self, self._call("POST", f"/jobs/{job_id}/release/"))

    def resubmit(self, job_id: int) -> Job:
        """Submit a new job with the request of an ended one; returns the new job."""
        return Job(self, self._call("POST", f"/jobs/{job_id}/resubmit/", retry=False))

    # --- teams -------------------------------------------------------------------------------

    def teams(self) -> list[dict[str, Any]]:
        """My teams (every team for a site admin), with quota, units in use and job counts."""
        return list(self._call("GET", "/teams/"))

    def team(self, name: str) -> dict[str, Any]:
        """One team: quota, units in use now, job counts, members."""
        return dict(self._call("GET", f"/teams/{name}/"))

    def usage(
        self, team: str, start: date | str | None = None, end: date | str | None = None
    ) -> dict[str, Any]:
        """A team's usage from day ``start`` to day ``end`` (UTC, both included; the portal's
        default: the last 30 days): GPU-unit-hours per day and member (``days``,
        ``members``), this budget period against the budget (``period``), the quota and
        what it holds now (``quota``) and its holdings hour by hour (``holdings``)."""
        query = {
            field: str(day) for field, day in (("from", start), ("to", end)) if day is not None
        }
        return dict(self._call("GET", f"/teams/{team}/usage/", query=query))

    # --- HTTP --------------------------------------------------------------------------------

    def _patiently(self, call: Callable[[], T]) -> T:
        """``call()``, waiting out the rate limit: a long wait or follow must not die of it."""
        while True:
            try:
                return call()
            except RateLimited as limited:
                time.sleep(min(limited.retry_after or 5.0, MAX_RETRY_WAIT_S))

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        retry: bool = True,
    ) -> Any:
        url = self.api + path
        request = f"{method} {path}"
        tries = 1 + (self.retries if retry else 0)
        for attempt in range(tries):
            last = attempt == tries - 1
            try:
                response = self._http.request(method, url, params=query, json=body)
            except httpx.TransportError as error:
                if last:
                    raise PortalUnavailable(
                        None,
                        {"detail": f"cannot reach the portal at {url}: {_describe(error)}"},
                        request,
                        url,
                    ) from error
                time.sleep(self._backoff(attempt, None))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                time.sleep(self._backoff(attempt, response.headers.get("Retry-After")))
                continue
            if response.is_error:
                raise error_for(
                    response.status_code,
                    response.content,
                    request=request,
                    url=url,
                    retry_after=response.headers.get("Retry-After"),
                )
            return response.json()
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        if retry_after is not None and retry_after.strip().isdigit():
            return min(float(retry_after), MAX_RETRY_WAIT_S)
        return min(self.backoff * 2.0**attempt, MAX_RETRY_WAIT_S)


def _describe(error: httpx.TransportError) -> str:
    if isinstance(error, httpx.TimeoutException):
        return f"no answer in time ({type(error).__name__})"
    text = str(error) or type(error).__name__
    return text
