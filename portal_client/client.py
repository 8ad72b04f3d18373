"""`PortalClient`: the REST API (docs/api.md) as a few typed methods over urllib."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Iterable
from typing import Any, Required, TypedDict, Unpack, cast
from urllib.parse import parse_qsl, urlencode, urlsplit

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


class PortalError(Exception):
    """The portal refused a request.

    ``status`` is the HTTP status; ``errors`` maps each field (a dotted path into the body,
    such as ``gpu.profile``; ``detail`` or ``authorization`` for none) to its message.
    """

    def __init__(self, status: int, errors: dict[str, str], request: str = "") -> None:
        super().__init__(status, errors)
        self.status = status
        self.errors = errors
        self.request = request

    def __str__(self) -> str:
        where = f" on {self.request}" if self.request else ""
        fields = "".join(f"\n  {field}: {message}" for field, message in self.errors.items())
        return f"HTTP {self.status}{where}:{fields}"


class PortalClient:
    """The portal's REST API with one user's token.

    ``url`` is the portal's address (``http://127.0.0.1:8000/``; a URL ending in ``/api/v1``
    works too); ``token`` comes from ``python manage.py issue_token <username>``.
    """

    def __init__(self, url: str, token: str, *, timeout: float = 30.0) -> None:
        base = url.rstrip("/")
        self.api = base if base.endswith("/api/v1") else base + "/api/v1"
        self.token = token
        self.timeout = timeout

    @classmethod
    def from_env(cls) -> PortalClient:
        """A client for ``PORTAL_URL`` with ``PORTAL_TOKEN``."""
        names = ("PORTAL_URL", "PORTAL_TOKEN")
        missing = [name for name in names if not os.environ.get(name, "").strip()]
        if missing:
            raise ValueError(
                f"{' and '.join(missing)} not set; export PORTAL_URL (e.g. "
                "http://127.0.0.1:8000/) and PORTAL_TOKEN (from `manage.py issue_token <user>`)"
            )
        return cls(os.environ["PORTAL_URL"].strip(), os.environ["PORTAL_TOKEN"].strip())

    def __repr__(self) -> str:
        return f"PortalClient({self.api!r})"  # never the token: reprs end up in notebooks

    # --- jobs ------------------------------------------------------------------------------

    def submit(self, **job: Unpack[JobRequest]) -> dict[str, Any]:
        """Submit a job; returns it as ``job()`` shows it (``state`` PENDING or later)."""
        return cast(dict[str, Any], self._call("POST", "/jobs/", body=dict(job)))

    def job(self, job_id: int) -> dict[str, Any]:
        """One job: state, exit code, slices, why it waits (``pending``), events."""
        return cast(dict[str, Any], self._call("GET", f"/jobs/{job_id}/"))

    def jobs(
        self, state: str | Iterable[str] | None = None, team: str | None = None
    ) -> list[dict[str, Any]]:
        """Every job of my teams, newest first, optionally only in ``state`` (one or several)
        or of ``team``; fetches page after page."""
        query: dict[str, str] = {}
        if state:
            query["state"] = state if isinstance(state, str) else ",".join(state)
        if team:
            query["team"] = team
        found: dict[int, dict[str, Any]] = {}
        while True:
            page = self._call("GET", "/jobs/", query=query)
            # A job submitted meanwhile shifts the pages by one; keep each job once.
            for job in page["results"]:
                found.setdefault(job["id"], job)
            if not page.get("next"):
                return list(found.values())
            # Only the next link's limit and offset: behind a proxy the absolute link the
            # server builds may name a host this client cannot reach.
            query = dict(parse_qsl(urlsplit(page["next"]).query))

    def log(self, job_id: int, attempt: int | None = None) -> str:
        """A job's output so far, of its latest attempt or of ``attempt``."""
        query = {} if attempt is None else {"attempt": str(attempt)}
        return str(self._call("GET", f"/jobs/{job_id}/log/", query=query)["log"])

    def cancel(self, job_id: int) -> dict[str, Any]:
        """Cancel a job: a waiting one at once, a running one when its agent has stopped it."""
        return cast(dict[str, Any], self._call("POST", f"/jobs/{job_id}/cancel/"))

    def wait(
        self,
        job_id: int,
        *,
        states: Collection[str] = TERMINAL,
        timeout: float | None = 3600.0,
        poll: float = 1.0,
    ) -> dict[str, Any]:
        """Poll a job every ``poll`` seconds until it is in one of ``states``; returns it.

        Raises TimeoutError after ``timeout`` seconds (None: wait as long as it takes).
        """
        wanted = {states} if isinstance(states, str) else set(states)
        unknown = sorted(wanted - STATES)
        if unknown or not wanted:
            raise ValueError(
                f"states: unknown {', '.join(unknown) or 'nothing given'}; "
                f"allowed: {', '.join(sorted(STATES))}"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["state"] in wanted:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"job {job_id} still {job['state']} after {timeout:g} s "
                    f"(waited for {', '.join(sorted(wanted))})"
                )
            time.sleep(poll)

    # --- teams -----------------------------------------------------------------------------

    def teams(self) -> list[dict[str, Any]]:
        """My teams (every team for a site admin), with quota, units in use and job counts."""
        return cast(list[dict[str, Any]], self._call("GET", "/teams/"))

    # --- HTTP ------------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        url = self.api + path + (f"?{urlencode(query)}" if query else "")
        # JSON for everything, the log and errors included (the log is text/plain otherwise).
        headers = {"Authorization": f"Token {self.token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            errors = _errors_of(error.read(), error.reason)
            raise PortalError(error.code, errors, f"{method} {path}") from None


def _errors_of(body: bytes, reason: str) -> dict[str, str]:
    """The API's ``{"errors": {...}}``; any other answer (a proxy's page) as ``detail``."""
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("errors"), dict):
        return {str(field): str(message) for field, message in payload["errors"].items()}
    text = body.decode(errors="replace").strip()
    return {"detail": text[:500] or str(reason)}
