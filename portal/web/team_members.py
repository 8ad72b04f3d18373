"""What the team page's Members section shows: the members, the controls a team admin (or
site admin) gets, and the team's audit log. Its views are in ``portal.web.members``."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from portal.tenants.audit import AUDIT_SHOWN, audit_for_team
from portal.tenants.members import ROLES, member_list
from portal.tenants.models import Team, TeamAuditEntry
from portal.tenants.selectors import can_admin_team

Action = TeamAuditEntry.Action
# What the audit log calls each field it records.
FIELD_WORDS = {
    "role": "role",
    "limit_units": "limit (GPU units)",
    "weight": "fair-share weight",
    "guaranteed_units": "guarantee (GPU units)",
    "max_priority": "highest priority",
    "member_limit_units": "per-member limit (GPU units)",
    "budget_gpu_hours": "monthly budget (GPU-unit-hours)",
}
QUOTA_FIELD_WORDS = {**FIELD_WORDS, "limit_units": "team limit (GPU units)"}
# The add form's inputs and what they show on an empty form.
MEMBER_FORM_DEFAULTS = {"username": "", "role": "member", "limit_units": ""}


def team_members_context(
    *,
    request: HttpRequest,
    team: Team,
    errors: dict[str, str] | None = None,
    error_for: str = "",
    values: dict[str, str] | None = None,
    confirm_remove: str = "",
    done: str = "",
) -> dict[str, Any]:
    """The Members section's context (three queries: members, admin check, audit log).

    ``errors`` belong to the add form when ``error_for`` is empty, else to the row of the
    member ``error_for``; ``confirm_remove`` names the member whose removal awaits its
    confirmation; ``done`` says what was just saved.
    """
    members = member_list(team=team)
    can_manage = can_admin_team(user=request.user, team=team)
    if confirm_remove and confirm_remove not in {m["username"] for m in members}:
        confirm_remove = ""
    return {
        "members": members,
        "can_manage_members": can_manage,
        "member_roles": ROLES,
        "member_values": values if values is not None else dict(MEMBER_FORM_DEFAULTS),
        "member_errors": errors or {},
        "member_error_for": error_for,
        "confirm_remove": confirm_remove if can_manage else "",
        "member_done": done,
        "audit_entries": [_audit_row(entry) for entry in audit_for_team(team=team)],
        "audit_shown": AUDIT_SHOWN,
        "me": request.user.get_username(),
    }


def _audit_row(entry: TeamAuditEntry) -> dict[str, Any]:
    """One audit entry in words: "added bob", "bob's limit (GPU units)", "quota: guarantee"."""
    if entry.action == Action.MEMBER_ADDED:
        what = f"added {entry.subject}"
    elif entry.action == Action.MEMBER_REMOVED:
        what = f"removed {entry.subject}"
    elif entry.action == Action.QUOTA_CHANGED:
        what = f"quota: {QUOTA_FIELD_WORDS.get(entry.field, entry.field)}"
    else:
        what = f"{entry.subject}'s {FIELD_WORDS.get(entry.field, entry.field)}"
    return {
        "at": entry.at,
        "who": entry.actor_name,
        "what": what,
        "old": entry.old_value,
        "new": entry.new_value,
    }
