"""Signals about jobs besides their state changes (those are ``transitions.job_state_changed``).

They live here, with the jobs, so that any app above (notifications, ``portal.notify``) can
listen without depending on the app that sends them.
"""

from __future__ import annotations

from django.dispatch import Signal

# A running job's GPUs stayed idle (``portal.agents.idle``): sent (sender=Job) after the
# commit that wrote its warning event, once per job and idle stretch, with job_id, attempt,
# idle_since (datetime), util_pct (the threshold, %) and reclaim_at (when it is stopped if it
# stays idle; None: it will not be).
job_idle = Signal()
