"""Launches and stops for the agents, as the apps below ``portal.agents`` ask for them.

A scheduling pass places jobs and picks preemption victims; a cancel stops a running job.
Building and sending those messages belongs to ``portal.agents`` (it reads allocations,
signs nothing it does not own, records each send for the reaper), which sits above jobs and
scheduling in the app order. So they call these two functions, and the agents app plugs in
its sender when Django starts (``AgentsConfig.ready``). Both are safe to repeat: messages are
built from the database, and agents are idempotent by (job, attempt).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class AgentSender(Protocol):
    def send_launches(self, job_ids: Iterable[int]) -> int: ...

    def request_stops(self, job_ids: Iterable[int]) -> int: ...


_sender: AgentSender | None = None


def install(sender: AgentSender) -> None:
    """Plug in what sends to the agents (called once, by the agents app when it is ready)."""
    global _sender
    _sender = sender


def send_launches(job_ids: Iterable[int]) -> int:
    """Send a launch for each ASSIGNED job among ``job_ids``; returns messages sent."""
    return _installed().send_launches(job_ids)


def request_stops(job_ids: Iterable[int]) -> int:
    """Send a stop for each job among ``job_ids`` whose stop was asked for; returns messages
    sent."""
    return _installed().request_stops(job_ids)


def _installed() -> AgentSender:
    if _sender is None:
        raise RuntimeError(
            "no agent sender installed: add 'portal.agents' to INSTALLED_APPS and call "
            "django.setup() before sending launches or stops"
        )
    return _sender
