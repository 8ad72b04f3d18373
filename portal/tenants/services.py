"""Writes about teams: quota changes, made by site admins only (changes to members:
``portal.tenants.members``). Every change is written to the team's audit log."""

from __future__ import annotations

import logging
import math
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from portal.passes import schedule_pass_on_commit
from portal.tenants.audit import audit_write
from portal.tenants.models import PRIORITY_CLASSES, Team, TeamAuditEntry
from portal.tenants.selectors import is_site_admin

log = logging.getLogger("portal.tenants")


class QuotaError(ValueError):
    """A quota change with bad values; ``errors`` maps each field to what it accepts."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Any = _Unchanged()

# Quota fields a site admin may change, and whether "no value" (None) is allowed for each.
_OPTIONAL_NUMBERS = ("limit_units", "member_limit_units", "budget_gpu_hours")
_REQUIRED_NUMBERS = ("weight", "guaranteed_units")


def quota_update(
    *,
    team: Team,
    by: Any,
    weight: Any = UNCHANGED,
    guaranteed_units: Any = UNCHANGED,
    limit_units: Any = UNCHANGED,
    max_priority: Any = UNCHANGED,
    member_limit_units: Any = UNCHANGED,
    budget_gpu_hours: Any = UNCHANGED,
) -> Team:
    """Change ``team``'s quota. Only site admins may; fields left UNCHANGED keep their value.

    Numbers are GPU units (hours for the budget); ``None`` means "no limit" for the limit,
    the member limit and the budget. Raises ``PermissionDenied`` or ``QuotaError``.
    """
    if not is_site_admin(by):
        raise PermissionDenied("only site admins may change a team's quota")
    given = {
        "weight": weight,
        "guaranteed_units": guaranteed_units,
        "limit_units": limit_units,
        "max_priority": max_priority,
        "member_limit_units": member_limit_units,
        "budget_gpu_hours": budget_gpu_hours,
    }
    changes = {name: value for name, value in given.items() if value is not UNCHANGED}
    errors: dict[str, str] = {}
    cleaned: dict[str, Any] = {}
    for name, value in changes.items():
        if name == "max_priority":
            if value not in PRIORITY_CLASSES:
                errors[name] = f"unknown class {value!r}; allowed: {', '.join(PRIORITY_CLASSES)}"
            else:
                cleaned[name] = value
            continue
        number, problem = non_negative_number(value, optional=name in _OPTIONAL_NUMBERS)
        if problem:
            errors[name] = problem
        else:
            cleaned[name] = number
    guaranteed = cleaned.get("guaranteed_units", team.guaranteed_units)
    limit = cleaned.get("limit_units", team.limit_units)
    if not errors and limit is not None and limit < guaranteed:
        field = "limit_units" if "limit_units" in cleaned else "guaranteed_units"
        errors[field] = (
            f"the limit ({limit:g}) must not be below the guarantee ({guaranteed:g}); "
            "allowed: limit >= guarantee, or no limit (null)"
        )
    if errors:
        raise QuotaError(errors)
    if not cleaned:
        return team
    with transaction.atomic():
        # The values before, read under the row's lock, for the audit log's "old -> new".
        before = Team.objects.select_for_update().filter(pk=team.pk).values(*cleaned).get()
        Team.objects.filter(pk=team.pk).update(**cleaned)
        now = timezone.now()
        for name, value in cleaned.items():
            if before[name] != value:
                audit_write(
                    team=team,
                    by=by,
                    action=TeamAuditEntry.Action.QUOTA_CHANGED,
                    at=now,
                    field=name,
                    old=before[name],
                    new=value,
                )
        # The scheduler reads quotas on every pass; ask for one so the change shows at once.
        schedule_pass_on_commit()
    log.info("quota of team %s changed by %s: %s", team.name, by, cleaned)
    team.refresh_from_db()
    return team


# No site has a million GPUs: a bigger quota is a typo (or an attempt to overflow a column).
QUOTA_MAX = 1_000_000


def non_negative_number(
    value: Any, *, optional: bool, maximum: float = QUOTA_MAX, null_means: str = "no limit"
) -> tuple[float | None, str]:
    """``value`` as a number from 0 to ``maximum`` (None for null/"" when ``optional``), or
    the problem with it, naming what is allowed."""
    top = f"{maximum:g}" if maximum != int(maximum) else str(int(maximum))
    allowed = f"a number from 0 to {top}" + (f", or null for {null_means}" if optional else "")
    if value is None or value == "":
        if optional:
            return None, ""
        return None, f"required; allowed: {allowed}"
    if isinstance(value, bool):
        return None, f"{value!r} is not a number; allowed: {allowed}"
    shown = _shorten(repr(value))
    try:
        number = float(value)
    except OverflowError:
        # An integer too big for a float (JSON allows 10**400).
        return None, f"{shown} is out of range; allowed: {allowed}"
    except (TypeError, ValueError):
        return None, f"{shown} is not a number; allowed: {allowed}"
    if not math.isfinite(number) or not 0 <= number <= maximum:
        return None, f"{shown} is out of range; allowed: {allowed}"
    return number, ""


def _shorten(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
