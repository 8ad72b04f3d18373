"""bench/client_poll.py measures what it says: every poll of wait() against its stub portal."""

from __future__ import annotations

import pytest
from flaky_http import flaky_portal

from bench.client_poll import main, run


def test_the_poll_benchmark_times_each_poll_of_wait_against_its_stub() -> None:
    figures = run(polls=5, poll=0.01)

    assert figures["target"] == "stub portal on 127.0.0.1"
    # Five PENDING answers, then the SUCCEEDED one that ends the wait.
    waits = ("wait_quiet", "wait_progress", "wait_added")
    assert [figures[name]["polls"] for name in waits] == [6, 6, 6]
    for name in ("round_trip", "call"):
        assert 0 < figures[name]["median_ms"] <= figures[name]["p90_ms"]
    for name in waits:
        assert figures[name]["mean_ms"] > 0 and figures[name]["cpu_ms"] > 0


def test_a_portal_that_refuses_for_its_rate_limit_stops_the_bench_with_a_reason(capsys) -> None:
    """Against a running portal the bench makes about five times --polls requests in the
    minute: one the API's rate limit refuses ends it with exit code 3 and what to do."""
    with (
        flaky_portal(failures=10**6, status=429) as (url, seen),
        pytest.raises(SystemExit) as stopped,
    ):
        main(["--url", url, "--token", "t", "--job", "1"])
    assert stopped.value.code == 3
    assert seen == ["GET /api/v1/jobs/1/"]  # refused at once: nothing retried
    said = capsys.readouterr().err
    assert "rate limit" in said and "about 250 requests" in said and "--polls" in said
