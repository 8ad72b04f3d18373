"""bench/client_poll.py measures what it says: every poll of wait() against its stub portal."""

from __future__ import annotations

from bench.client_poll import run


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
