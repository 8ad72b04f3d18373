"""The time ``PortalClient.wait()`` adds per poll, beyond the ``poll`` seconds it sleeps.

``wait()`` polls ``GET /api/v1/jobs/<id>/``, builds a ``Job``, redraws its progress line
and sleeps ``poll`` seconds; the sleep does not subtract the poll's own time, so each
round lasts ``poll`` plus what this measures. Timed here, each over ``--polls`` polls:

- ``round_trip``: a bare ``GET`` of the job with the client's own httpx connection (the
  server's answer time and the loopback, nothing of the client's);
- ``call``: ``portal.job(id)``, the same GET through the client (error mapping, JSON
  decoding, the ``Job`` object);
- ``wait_quiet`` / ``wait_progress``: one poll of ``wait(..., poll=0)`` without and with
  its progress line (tqdm, redrawn on every poll; drawn into a buffer here, not a terminal);
- ``wait_added``: ``wait(..., poll=--poll)``'s round minus ``--poll``: what a real wait
  adds to each poll, all of the above included.

Against a stub portal on 127.0.0.1 (default; a threaded HTTP/1.1 server answering a job
detail the shape of the API's, PENDING with a pending explanation for ``--polls`` polls,
then SUCCEEDED), or against a running portal with ``--url URL --token TOKEN --job ID`` (an
ended job: ``wait`` then waits for a state it never reaches and stops at its timeout).

    python -m bench.client_poll [--polls 200] [--poll 0.05] [--url ... --token ... --job N]

Against a running portal ``--polls`` is 50 unless given: the five measurements make about
five times ``--polls`` requests within the minute, and the API's rate limit per token
(``PORTAL_API_THROTTLE_TOKEN``, 300 a minute by default) refuses more (the bench then stops
and says so).

prints the figures as JSON, in milliseconds per poll: wall time (median and p90, or the mean
for ``wait_*``) and ``cpu_ms``, the CPU time of the calling thread alone (the client's own
work, not the stub's, and steady on a loaded machine).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from portal_client import PortalClient, RateLimited, WaitTimeout
from portal_client.errors import error_for

PENDING = {
    "code": "QUOTA_LIMIT",
    "message": "team uses 4 of 4 units, job needs 1",
    "numbers": {"used": 4.0, "limit": 4.0, "needs": 1.0},
    "position": 3,
    "estimated_start_at": "2026-12-02T14:05:00Z",
}


def job_detail(job_id: int, *, ended: bool) -> dict[str, Any]:
    """A job as ``GET /api/v1/jobs/<id>/`` describes it (docs/api.md), PENDING or SUCCEEDED."""
    event = {"at": "2026-12-02T14:00:00Z", "from_state": "", "to_state": "PENDING"}
    return {
        "id": job_id,
        "name": "bench",
        "team": "vision",
        "user": "alice",
        "state": "SUCCEEDED" if ended else "PENDING",
        "attempt": 1 if ended else 0,
        "gpu": {"kind": "mps", "count": 1, "profile": "", "model": "", "multi_node": False},
        "priority": "normal",
        "exit_code": 0 if ended else None,
        "reason": "exited 0" if ended else "",
        "node": "local-1" if ended else None,
        "submitted_at": "2026-12-02T14:00:00Z",
        "started_at": "2026-12-02T14:06:00Z" if ended else None,
        "finished_at": "2026-12-02T14:07:00Z" if ended else None,
        "pending": None if ended else PENDING,
        "array": None,
        "image": "python:3.11-slim",
        "command": ["python3", "-c", "print('hi')"],
        "env": {"SEED": "1"},
        "time_limit_s": 3600,
        "preemptible": True,
        "borrowed": False,
        "queued_since": "2026-12-02T14:00:00Z",
        "assigned_at": None,
        "stop_requested_at": None,
        "stop_reason": "",
        "depends_on": [],
        "notify": None,
        "slices": [],
        "events": [{**event, "attempt": 0, "message": "submitted"}] * 3,
    }


class StubPortal:
    """``GET /api/v1/jobs/<id>/`` on a free loopback port: PENDING for the first ``polls``
    answers about each job, SUCCEEDED after."""

    def __init__(self, polls: int) -> None:
        answers: dict[int, int] = {}
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as gunicorn answers httpx
            # Headers and body are two writes: with Nagle on, each answer would wait for
            # the client's delayed ACK (40 ms), a figure of the stub, not of the client.
            disable_nagle_algorithm = True

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                job_id = int(self.path.rstrip("/").rsplit("/", 1)[1])
                with lock:
                    answers[job_id] = answers.get(job_id, 0) + 1
                    ended = answers[job_id] > polls
                body = json.dumps(job_detail(job_id, ended=ended)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> StubPortal:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _each_ms(polls: int, once: Callable[[], object]) -> dict[str, float]:
    spans = []
    cpu = time.thread_time()
    for _ in range(polls):
        started = time.perf_counter()
        once()
        spans.append((time.perf_counter() - started) * 1000.0)
    cpu_ms = (time.thread_time() - cpu) / polls * 1000.0
    spans.sort()
    return {
        "median_ms": statistics.median(spans),
        "p90_ms": spans[int(len(spans) * 0.9)],
        "cpu_ms": cpu_ms,
    }


@contextlib.contextmanager
def _counting(portal: PortalClient) -> Iterator[list[int]]:
    """Counts the answers the client receives (``[n]``) while the block runs."""
    seen = [0]

    def hook(response: Any) -> None:
        seen[0] += 1

    portal._http.event_hooks["response"].append(hook)
    try:
        yield seen
    finally:
        portal._http.event_hooks["response"].remove(hook)


def _wait_ms(
    portal: PortalClient,
    job_id: int,
    *,
    polls: int,
    poll: float,
    progress: bool,
    live_answer_s: float | None,
) -> dict[str, float]:
    """Mean milliseconds per poll of one ``wait()`` of about ``polls`` polls, minus the
    sleeps. Live (``live_answer_s``: the portal's answer time), the job has ended and never
    reaches HELD: ``wait`` polls until a timeout sized for ``polls`` polls."""
    drawn = io.StringIO()
    with _counting(portal) as seen, contextlib.redirect_stderr(drawn):
        started, cpu = time.perf_counter(), time.thread_time()
        if live_answer_s is not None:
            timeout = polls * (poll + live_answer_s)
            with contextlib.suppress(WaitTimeout):
                portal.wait(job_id, states={"HELD"}, timeout=timeout, poll=poll, progress=progress)
        else:
            portal.wait(job_id, poll=poll, progress=progress)
        spent, cpu_spent = time.perf_counter() - started, time.thread_time() - cpu
    sleeps = (seen[0] - 1) * poll  # no sleep after the last poll
    assert not progress or "job " in drawn.getvalue(), "the progress line was not drawn"
    return {
        "mean_ms": (spent - sleeps) / seen[0] * 1000.0,
        "cpu_ms": cpu_spent / seen[0] * 1000.0,
        "polls": seen[0],
    }


def _bare_get(portal: PortalClient, url: str) -> None:
    """A GET with the client's own connection and none of the client's work; an error answer
    raises the client's exception for it, as the client would (``RateLimited`` for a 429)."""
    response = portal._http.get(url)
    if response.is_error:
        raise error_for(
            response.status_code,
            response.content,
            request=f"GET {url}",
            url=url,
            retry_after=response.headers.get("Retry-After"),
        )


def run(
    *, polls: int = 200, poll: float = 0.05, url: str | None = None, token: str = "",
    job: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    live = url is not None
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(StubPortal(polls)).url
        portal = stack.enter_context(PortalClient(url, token or "bench", retries=0))
        # The stub's job ids: each wait() a fresh one, PENDING for `polls` answers.
        ids = iter(range(1, 10_000))
        probe = job if job is not None else 999_999
        detail = f"{portal.api}/jobs/{probe}/"
        round_trip = _each_ms(polls, lambda: _bare_get(portal, detail))
        figures: dict[str, Any] = {
            "target": "live portal" if live else "stub portal on 127.0.0.1",
            "polls": polls,
            "round_trip": round_trip,
            "call": _each_ms(polls, lambda: portal.job(probe)),
        }
        answer_s = round_trip["median_ms"] / 1000.0 if live else None
        for name, wait_poll, progress in (
            ("wait_quiet", 0.0, False),
            ("wait_progress", 0.0, True),
            ("wait_added", poll, True),
        ):
            figures[name] = _wait_ms(
                portal,
                job if job is not None else next(ids),
                polls=polls,
                poll=wait_poll,
                progress=progress,
                live_answer_s=answer_s,
            )
        figures["wait_added"]["poll_s"] = poll
    return figures


# Polls per measurement: against the stub, and against a running portal (its rate limit).
STUB_POLLS, LIVE_POLLS = 200, 50


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.client_poll", description=__doc__)
    parser.add_argument("--polls", type=int, help="polls per measurement (200; 50 with --url)")
    parser.add_argument("--poll", type=float, default=0.05, help="wait()'s poll, seconds")
    parser.add_argument("--url", help="a running portal instead of the stub")
    parser.add_argument("--token", default="")
    parser.add_argument("--job", type=int, help="an ended job of the token's user (--url)")
    args = parser.parse_args(argv)
    if args.url and (not args.token or args.job is None):
        parser.error("--url needs --token and --job")
    polls = args.polls if args.polls is not None else (LIVE_POLLS if args.url else STUB_POLLS)
    try:
        figures = run(polls=polls, poll=args.poll, url=args.url, token=args.token, job=args.job)
    except RateLimited as error:
        parser.exit(
            3,
            f"the portal's rate limit refused a request ({error}): about {5 * polls} requests "
            f"within the minute are more than the token may send (PORTAL_API_THROTTLE_TOKEN); "
            f"use a smaller --polls\n",
        )
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
