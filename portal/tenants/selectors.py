"""Reads about teams: who sees which team and who administers it.

How a team stands now (what its jobs hold, its job counts) is read with its jobs:
``portal.jobs.selectors.team_overviews``.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from portal.tenants.models import Membership, Team


def is_site_admin(user: Any) -> bool:
    """Site admins (Django staff or superusers) see and administer every team."""
    return bool(getattr(user, "is_authenticated", False) and (user.is_staff or user.is_superuser))


def teams_for_user(*, user: Any) -> QuerySet[Team]:
    """The teams ``user`` may see: all of them for a site admin, otherwise their own."""
    if not getattr(user, "is_authenticated", False):
        return Team.objects.none()
    if is_site_admin(user):
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user).distinct()


def member_teams(*, user: Any) -> QuerySet[Team]:
    """The teams ``user`` is a member of (what they may submit to), site admins included."""
    if not getattr(user, "is_authenticated", False):
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user).distinct()


def memberships_for_user(*, user: Any) -> QuerySet[Membership]:
    """``user``'s memberships (the teams of ``member_teams``, with the member's own limit),
    their teams joined, by team name."""
    if not getattr(user, "is_authenticated", False):
        return Membership.objects.none()
    return Membership.objects.filter(user=user).select_related("team").order_by("team__name")


def can_admin_team(*, user: Any, team: Team) -> bool:
    """A site admin administers every team; a team admin their own team."""
    if is_site_admin(user):
        return True
    if not getattr(user, "is_authenticated", False):
        return False
    return Membership.objects.filter(team=team, user=user, role=Membership.Role.ADMIN).exists()
