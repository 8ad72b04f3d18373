"""The audit log of a team: every change to its members or its quota, who made it and when,
with the value before and after.

The services that make a change write its entry in the same transaction
(``portal.tenants.members``, ``portal.tenants.services.quota_update``), so the log never
shows a change that did not happen or misses one that did.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from portal.tenants.models import Team, TeamAuditEntry

# How many entries the team page shows (the API takes up to AUDIT_MAX with ?limit=).
AUDIT_SHOWN = 20
AUDIT_MAX = 500


def audit_text(value: Any) -> str:
    """A value as the log shows it: "" for none, numbers without a trailing .0."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def audit_write(
    *,
    team: Team,
    by: Any,
    action: str,
    at: datetime,
    subject: str = "",
    field: str = "",
    old: Any = None,
    new: Any = None,
) -> TeamAuditEntry:
    """Record one change (call inside the transaction that makes it)."""
    return TeamAuditEntry.objects.create(
        team=team,
        actor=by if getattr(by, "pk", None) is not None else None,
        actor_name=by.get_username() if hasattr(by, "get_username") else str(by),
        action=action,
        subject=subject,
        field=field,
        old_value=audit_text(old),
        new_value=audit_text(new),
        at=at,
    )


def audit_for_team(*, team: Team, limit: int = AUDIT_SHOWN) -> QuerySet[TeamAuditEntry]:
    """The latest ``limit`` entries of ``team``, newest first (one query)."""
    return TeamAuditEntry.objects.filter(team=team).order_by("-at", "-id")[:limit]
