"""A team's members, managed by its team admins (and site admins): add one by username,
remove one, make one a team admin or a member, set one's limit in GPU units.

One service per action, used by the team page and the API alike. Each checks who asks
(``PermissionDenied``), checks every value (``MemberError``, naming the field and what it
allows, before anything is stored), makes the change and writes it to the team's audit log
in one transaction.

What a team admin may not do stays with site admins (``quota_update``): the team's
guarantee, limit, weight, budget, highest priority and per-member limit. A member's own
limit can therefore only tighten the team's per-member limit, never exceed it.

Removing a member takes their access to the team's jobs and pages away at once (every read
goes through ``teams_for_user``, which reads the memberships); the jobs they submitted stay
as they are: running ones run on, pending ones wait, until they end or someone cancels them.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.passes import schedule_pass_on_commit
from portal.tenants.audit import audit_write
from portal.tenants.models import Membership, Team, TeamAuditEntry
from portal.tenants.selectors import can_admin_team
from portal.tenants.services import QUOTA_MAX, non_negative_number

ROLES = tuple(Membership.Role.values)  # ("member", "admin")
Action = TeamAuditEntry.Action


class MemberError(ValueError):
    """A change to a team's members with bad values; ``errors`` maps each field to what it
    accepts. Nothing was stored."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors


# --- reads ----------------------------------------------------------------------------------


def effective_limit(own: float | None, team_limit: float | None) -> float | None:
    """The units a member may hold: the smaller of their own limit and the team's per-member
    limit (None: no limit). The scheduler applies the same rule (``scheduler.model.Team``)."""
    if own is None:
        return team_limit
    if team_limit is None:
        return own
    return min(own, team_limit)


def member_list(*, team: Team, username: str | None = None) -> list[dict[str, Any]]:
    """The members of ``team`` by username (one query): role, own limit (None: the team's),
    the limit that applies to them (None: no limit) and when they joined. With ``username``:
    only that member (an empty list if they are none)."""
    memberships = Membership.objects.filter(team=team)
    if username is not None:
        memberships = memberships.filter(user__username=username)
    rows = memberships.order_by("user__username").values_list(
        "user__username", "role", "limit_units", "created_at"
    )
    return [
        {
            "username": username,
            "role": role,
            "limit_units": limit,
            "effective_limit_units": effective_limit(limit, team.member_limit_units),
            "joined_at": joined_at,
        }
        for username, role, limit, joined_at in rows
    ]


# --- writes ---------------------------------------------------------------------------------


def member_add(
    *,
    team: Team,
    by: Any,
    username: Any,
    role: Any = Membership.Role.MEMBER,
    limit_units: Any = None,
) -> Membership:
    """Make the user ``username`` a member of ``team`` with ``role`` and, optionally, a limit."""
    _require_admin(by, team)
    errors: dict[str, str] = {}
    user = None
    name = username.strip() if isinstance(username, str) else ""
    if not name:
        errors["username"] = "required; allowed: the username of an existing account"
    else:
        user = get_user_model().objects.filter(username=name, is_active=True).first()
        if user is None:
            errors["username"] = (
                f"no active account {_shown(name)}; allowed: the username of an existing "
                "account (site admins create accounts)"
            )
        elif Membership.objects.filter(team=team, user=user).exists():
            errors["username"] = (
                f"{name} is already a member of {team.name}; change their role or limit in "
                "the list of members instead"
            )
    role_problem = _role_problem(role)
    if role_problem:
        errors["role"] = role_problem
    limit, limit_problem = _limit(limit_units, team)
    if limit_problem:
        errors["limit_units"] = limit_problem
    if errors:
        raise MemberError(errors)
    assert user is not None
    now = timezone.now()
    try:
        with transaction.atomic():
            membership = Membership.objects.create(
                team=team, user=user, role=role, limit_units=limit
            )
            audit_write(
                team=team,
                by=by,
                action=Action.MEMBER_ADDED,
                at=now,
                subject=name,
                field="role",
                new=role,
            )
            if limit is not None:
                audit_write(
                    team=team,
                    by=by,
                    action=Action.LIMIT_CHANGED,
                    at=now,
                    subject=name,
                    field="limit_units",
                    new=limit,
                )
                schedule_pass_on_commit()
    except IntegrityError:
        # Someone added them in the meantime (one membership per team and user).
        raise MemberError({"username": f"{name} is already a member of {team.name}"}) from None
    return membership


def member_remove(*, team: Team, by: Any, username: str) -> None:
    """Remove ``username`` from ``team``; refused for the team's last team admin."""
    _require_admin(by, team)
    with transaction.atomic():
        membership = _locked_membership(team, username)
        if membership.role == Membership.Role.ADMIN and _admin_count(team) == 1:
            raise MemberError(
                {
                    "username": (
                        f"{username} is the last team admin of {team.name}; make another member "
                        "a team admin first (a team keeps at least one)"
                    )
                }
            )
        membership.delete()
        audit_write(
            team=team,
            by=by,
            action=Action.MEMBER_REMOVED,
            at=timezone.now(),
            subject=username,
            field="role",
            old=membership.role,
        )


def member_set_role(*, team: Team, by: Any, username: str, role: Any) -> Membership:
    """Make ``username`` a team admin (``admin``) or a plain member (``member``)."""
    _require_admin(by, team)
    problem = _role_problem(role)
    if problem:
        raise MemberError({"role": problem})
    with transaction.atomic():
        membership = _locked_membership(team, username)
        old = membership.role
        if old == role:
            return membership
        if old == Membership.Role.ADMIN and _admin_count(team) == 1:
            raise MemberError(
                {
                    "role": (
                        f"{username} is the last team admin of {team.name}; allowed: admin, "
                        "until another member is a team admin (a team keeps at least one)"
                    )
                }
            )
        _store(membership, "role", role, team=team, by=by, action=Action.ROLE_CHANGED)
    return membership


def member_set_limit(*, team: Team, by: Any, username: str, limit_units: Any) -> Membership:
    """Set the GPU units ``username`` may hold in ``team`` (None: the team's per-member limit).

    It may not exceed the team's per-member limit, which only a site admin raises."""
    _require_admin(by, team)
    limit, problem = _limit(limit_units, team)
    if problem:
        raise MemberError({"limit_units": problem})
    with transaction.atomic():
        membership = _locked_membership(team, username)
        if membership.limit_units == limit:
            return membership
        _store(membership, "limit_units", limit, team=team, by=by, action=Action.LIMIT_CHANGED)
        # The scheduler reads limits on every pass; ask for one so the change shows at once.
        schedule_pass_on_commit()
    return membership


# --- helpers --------------------------------------------------------------------------------


def _require_admin(by: Any, team: Team) -> None:
    if not can_admin_team(user=by, team=team):
        raise PermissionDenied(
            f"only a team admin of {team.name} or a site admin may manage its members"
        )


def _store(
    membership: Membership, field: str, value: Any, *, team: Team, by: Any, action: str
) -> None:
    """Set ``field`` of the locked ``membership`` to ``value`` and write the change, old and
    new, to the team's audit log (inside the caller's transaction)."""
    old = getattr(membership, field)
    Membership.objects.filter(pk=membership.pk).update(**{field: value})
    setattr(membership, field, value)
    audit_write(
        team=team,
        by=by,
        action=action,
        at=timezone.now(),
        subject=membership.user.get_username(),
        field=field,
        old=old,
        new=value,
    )


def _locked_membership(team: Team, username: str) -> Membership:
    """The membership, locked for this transaction; ``Membership.DoesNotExist`` (a 404) if
    ``username`` is not a member."""
    try:
        return (
            Membership.objects.select_for_update(of=("self",))
            .select_related("user")
            .get(team=team, user__username=username)
        )
    except Membership.DoesNotExist:
        raise Membership.DoesNotExist(f"no member {username!r} in team {team.name}") from None


def _admin_count(team: Team) -> int:
    """The team's admins, their rows locked: two admins demoting each other at once cannot
    both pass this check and leave the team with none."""
    admins = Membership.objects.select_for_update().filter(team=team, role=Membership.Role.ADMIN)
    return len(list(admins.values_list("pk", flat=True)))


def _role_problem(role: Any) -> str:
    if role in ROLES:
        return ""
    return f"unknown role {_shown(role)}; allowed: {', '.join(ROLES)}"


def _limit(value: Any, team: Team) -> tuple[float | None, str]:
    """A member limit: a number from 0 to the team's per-member limit, or None."""
    cap = team.member_limit_units
    null_means = (
        "the team's per-member limit" if cap is None else f"the team's per-member limit ({cap:g})"
    )
    number, problem = non_negative_number(
        value, optional=True, maximum=QUOTA_MAX, null_means=null_means
    )
    if problem:
        return None, problem
    if cap is not None and number is not None and number > cap:
        return None, (
            f"{number:g} is above the team's per-member limit ({cap:g} units), which only a "
            f"site admin may raise; allowed: a number from 0 to {cap:g}, or null for "
            f"{null_means}"
        )
    return number, ""


def _shown(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
