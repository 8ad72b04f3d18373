"""Small formatting filters for the pages."""

from __future__ import annotations

import shlex
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince

register = template.Library()

# A node's status (``portal.jobs.capacity.node_status``) in the colours of the job state it
# resembles (static/css/portal.css): the Nodes and Cluster pages.
NODE_BADGES = {
    "ready": "state-SUCCEEDED",
    "lost": "state-LOST",
    "cordoned": "state-PENDING",
    "draining": "state-PREEMPTED",
    "drained": "state-CANCELLED",
}


@register.filter
def units(value: Any) -> str:
    """GPU units as people read them: ``1``, ``0.43``, ``—`` for none."""
    if value is None or value == "":
        return "—"
    return f"{round(float(value), 2):g}"


@register.filter
def unit_hours(value: Any) -> str:
    """GPU-unit-hours as ``units`` writes them, but a charge too small to show in two
    decimals (a job of a few seconds) reads ``< 0.01``, not ``0``."""
    if value is not None and value != "" and 0 < float(value) < 0.005:
        return "< 0.01"
    return units(value)


@register.filter
def node_badge(status: str) -> str:
    """The badge class of a node's status: ``state-SUCCEEDED`` for ``ready``."""
    return NODE_BADGES.get(status, "")


@register.filter
def gpu_request(job: Any) -> str:
    """A job's GPU request in words: ``2 × whole GPU (NVIDIA A100)``, ``1 × MIG 1g.10gb``."""
    count = f"{job.gpu_min_count}–{job.gpu_count}" if job.gpu_min_count else str(job.gpu_count)
    if job.gpu_kind == "mig":
        what = f"MIG {job.gpu_profile}"
    elif job.gpu_kind == "mps":
        what = "MPS share" if job.gpu_count == 1 else "MPS shares"
    else:
        what = "whole GPU" if job.gpu_count == 1 else "whole GPUs"
        if job.gpu_model:
            what += f" ({job.gpu_model})"
    return f"{count} × {what}"


@register.filter
def seconds(value: Any) -> str:
    """A duration in seconds as ``1h 05m``, ``3m 20s``, ``45s``; ``—`` for none."""
    if value is None or value == "":
        return "—"
    total = int(value)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


@register.filter
def percent_of(value: Any, whole: Any) -> float:
    """``value`` as a percentage of ``whole``, capped to 0..100 (for meters)."""
    try:
        share = 100.0 * float(value) / float(whole)
    except (TypeError, ValueError, ZeroDivisionError):
        return 0.0
    return max(0.0, min(100.0, share))


@register.filter
def shell_join(argv: Any) -> str:
    """A command's argv as one line a shell would split back the same way.

    Double quotes where they are enough (``python -c "print('hi')"``, as people type it);
    shlex's single quotes otherwise.
    """
    if isinstance(argv, str):
        return argv
    return " ".join(_shell_quote(str(arg)) for arg in argv or ())


def _shell_quote(arg: str) -> str:
    quoted = shlex.quote(arg)
    if quoted == arg or any(c in arg for c in '"\\$`!'):
        return quoted
    return f'"{arg}"'


@register.filter
def ago(when: Any) -> str:
    """``just now`` for the last minute, else ``5 minutes ago``."""
    if when is None:
        return "—"
    if (timezone.now() - when).total_seconds() < 60:
        return "just now"
    return f"{timesince(when)} ago"


@register.filter
def lines(messages: Any) -> SafeString:
    """An input's error messages one per line, each escaped (one message may be a plain str)."""
    if isinstance(messages, str):
        messages = [messages]
    return format_html_join(mark_safe("<br>"), "{}", ((message,) for message in messages or ()))


@register.filter
def run_seconds(job: Any, now: Any) -> int | None:
    """How long ``job`` has run (until ``now``) while it runs, or ran once it ended; None for
    a job that is not running and did not run to its end (waiting, requeued, cancelled while
    waiting)."""
    if job.started_at is None:
        return None
    if job.state == "RUNNING":
        return max(0, int((now - job.started_at).total_seconds()))
    if job.is_terminal and job.finished_at is not None:
        return max(0, int((job.finished_at - job.started_at).total_seconds()))
    return None
