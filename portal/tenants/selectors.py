"""Reads about teams: who sees which team, who administers it, and how it stands now."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum

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


def can_admin_team(*, user: Any, team: Team) -> bool:
    """A site admin administers every team; a team admin their own team."""
    if is_site_admin(user):
        return True
    if not getattr(user, "is_authenticated", False):
        return False
    return Membership.objects.filter(team=team, user=user, role=Membership.Role.ADMIN).exists()


def team_overview(*, team: Team) -> dict[str, Any]:
    """Quota, what the team holds now, its job counts and its members."""
    return team_overviews(teams=[team])[0]


def team_overviews(*, teams: Iterable[Team]) -> list[dict[str, Any]]:
    """``team_overview`` for many teams in a fixed number of queries (three), not per team."""
    # Imported here: jobs and cluster import tenants, not the other way round at load time.
    from portal.cluster.models import Allocation
    from portal.jobs.models import Job, JobState

    teams = list(teams)
    ids = [team.pk for team in teams]
    units_in_use = dict(
        Allocation.objects.filter(job__team_id__in=ids, released_at__isnull=True)
        .values("job__team_id")
        .annotate(units=Sum("slice__units"))
        .values_list("job__team_id", "units")
    )
    counts = {
        row["team_id"]: row
        for row in Job.objects.filter(team_id__in=ids)
        .values("team_id")
        .annotate(
            running=Count("id", filter=Q(state__in=[JobState.ASSIGNED, JobState.RUNNING])),
            pending=Count("id", filter=Q(state=JobState.PENDING)),
            held=Count("id", filter=Q(state=JobState.HELD)),
        )
    }
    members: dict[int, list[dict[str, str]]] = defaultdict(list)
    for team_id, username, role in Membership.objects.filter(team_id__in=ids).values_list(
        "team_id", "user__username", "role"
    ):
        members[team_id].append({"username": username, "role": role})
    overviews = []
    for team in teams:
        row = counts.get(team.pk, {})
        overviews.append(
            {
                "name": team.name,
                "description": team.description,
                "weight": team.weight,
                "guaranteed_units": team.guaranteed_units,
                "limit_units": team.limit_units,
                "max_priority": team.max_priority,
                "member_limit_units": team.member_limit_units,
                "budget_gpu_hours": team.budget_gpu_hours,
                "units_in_use": round(units_in_use.get(team.pk) or 0.0, 6),
                "running_jobs": row.get("running", 0),
                "pending_jobs": row.get("pending", 0),
                "held_jobs": row.get("held", 0),
                "members": sorted(members[team.pk], key=lambda m: m["username"]),
            }
        )
    return overviews
