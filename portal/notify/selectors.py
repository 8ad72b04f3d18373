"""Reads about notifications: the deliveries a person may look at."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet

from portal.notify.models import Delivery
from portal.tenants.models import Membership


def deliveries_for_user(*, user: Any, limit: int = 20) -> QuerySet[Delivery]:
    """The latest deliveries to ``user`` (their e-mail and webhook), and to the webhooks of
    the teams they administer."""
    admin_of = Membership.objects.filter(user=user, role=Membership.Role.ADMIN).values("team_id")
    return (
        Delivery.objects.filter(Q(user=user) | Q(team_id__in=admin_of))
        .select_related("job")
        .order_by("-created_at", "-id")[:limit]
    )
