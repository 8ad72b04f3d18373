"""Reads about jobs, always through what the asking user may see."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet

from portal.jobs.models import Job, JobLogChunk
from portal.tenants.models import Team
from portal.tenants.selectors import teams_for_user


def job_list_for_user(
    *,
    user: Any,
    state: str | Iterable[str] | None = None,
    team: Team | str | None = None,
) -> QuerySet[Job]:
    """Jobs of the teams ``user`` may see, newest first, optionally of some states or one team.

    Team, user and node come in the same query, so a list page costs one query, not one per row.
    """
    jobs = Job.objects.filter(team__in=teams_for_user(user=user)).select_related(
        "team", "user", "node"
    )
    if state:
        jobs = jobs.filter(state=state) if isinstance(state, str) else jobs.filter(state__in=state)
    if team is not None:
        jobs = jobs.filter(team=team) if isinstance(team, Team) else jobs.filter(team__name=team)
    return jobs


def job_get_for_user(*, user: Any, job_id: int) -> Job:
    """The job ``job_id`` if ``user`` may see it; ``Job.DoesNotExist`` otherwise.

    A job of another team is reported exactly like a missing one, so ids reveal nothing.
    """
    return job_list_for_user(user=user).get(pk=job_id)


def job_log(*, job: Job, attempt: int | None = None) -> str:
    """The output of one attempt of ``job`` (its latest when ``attempt`` is None), in order."""
    if attempt is None:
        attempt = job.attempt
    chunks = JobLogChunk.objects.filter(job=job, attempt=attempt).order_by("seq")
    return "".join(chunks.values_list("data", flat=True))


def job_slices(*, job: Job) -> list[dict[str, Any]]:
    """The slices the job's latest attempt holds (or held), for people and the API."""
    from portal.cluster.models import Allocation

    allocations = (
        Allocation.objects.filter(job=job, attempt=job.attempt)
        .select_related("slice__gpu__node")
        .order_by("slice__gpu__node__name", "slice__gpu__index", "slice__key")
    )
    return [
        {
            "key": allocation.slice.key,
            "kind": allocation.slice.kind,
            "profile": allocation.slice.profile,
            "gpu_uuid": allocation.slice.gpu.uuid,
            "mig_uuid": allocation.slice.mig_uuid,
            "units": allocation.slice.units,
            "node": allocation.slice.gpu.node.name,
            "gpu_index": allocation.slice.gpu.index,
            "gpu_model": allocation.slice.gpu.model,
            "active": allocation.released_at is None,
        }
        for allocation in allocations
    ]
