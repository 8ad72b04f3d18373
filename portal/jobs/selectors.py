"""Reads about jobs (always through what the asking user may see), and about what teams'
jobs hold now: a team's overview and its usage including its running holds."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Func, IntegerField, Q, QuerySet, Sum

from portal.accounting.models import UsageBalance
from portal.accounting.selectors import budget_period_start, gpu_hours_in_period
from portal.accounting.usage import balance_at, hold_charge
from portal.compiled_queries import with_pk
from portal.jobs.models import (
    HOLDING_STATES,
    TERMINAL_STATES,
    Allocation,
    Job,
    JobLogChunk,
    JobState,
)
from portal.policy import scheduler_config
from portal.tenants.models import Membership, Team
from portal.tenants.selectors import is_site_admin, teams_for_user
from scheduler.units import billed_units


def job_list_for_user(
    *,
    user: Any,
    state: str | Iterable[str] | None = None,
    team: Team | str | None = None,
    mine: bool = False,
    name_contains: str = "",
) -> QuerySet[Job]:
    """Jobs of the teams ``user`` may see, newest first, optionally of some states or one team,
    only ``user``'s own (``mine``), or only those whose name contains ``name_contains`` (in any
    case).

    Team, user and node come in the same query, so a list page costs one query, not one per row.
    """
    jobs = Job.objects.filter(team__in=teams_for_user(user=user)).select_related(
        "team", "user", "node"
    )
    if state:
        jobs = jobs.filter(state=state) if isinstance(state, str) else jobs.filter(state__in=state)
    if team is not None:
        jobs = jobs.filter(team=team) if isinstance(team, Team) else jobs.filter(team__name=team)
    if mine:
        jobs = jobs.filter(user=user)
    if name_contains:
        jobs = jobs.filter(name__icontains=name_contains)
    return jobs


@dataclass(frozen=True)
class JobListShape:
    """``job_list_for_user``'s arguments split the way ``portal.compiled_queries`` takes them,
    so a list's SQL is compiled once per shape: ``key`` holds what decides the SQL (whether the
    user sees every team, which filters are on, how many states), ``values`` what only fills
    its parameters (the user's id, the states, the team's name), and ``build(values)`` is
    ``job_list_for_user`` itself called with those values.

    Whatever ``job_list_for_user`` decides from its arguments beyond their values belongs in
    ``key``: change one with the other.
    """

    key: tuple[Any, ...]
    values: tuple[Any, ...]
    user: Any
    states: tuple[str, ...] | None
    team: Team | str | None
    mine: bool
    name_contains: str

    def build(self, values: Sequence[Any]) -> QuerySet[Job]:
        user = with_pk(self.user, values[0])
        states = None if self.states is None else list(values[1 : 1 + len(self.states)])
        rest = list(values[1 + len(self.states or ()) :])
        team = rest.pop(0) if isinstance(self.team, str) else self.team
        name_contains = rest.pop(0) if self.name_contains else ""
        return job_list_for_user(
            user=user, state=states, team=team, mine=self.mine, name_contains=name_contains
        )


def job_list_shape(
    *,
    user: Any,
    state: str | Iterable[str] | None = None,
    team: Team | str | None = None,
    mine: bool = False,
    name_contains: str = "",
) -> JobListShape:
    """``job_list_for_user(user=..., ...)`` as a ``JobListShape``."""
    states = None if not state else ((state,) if isinstance(state, str) else tuple(state))
    key = (
        "job_list_for_user",
        bool(getattr(user, "is_authenticated", False)),
        is_site_admin(user),
        None if states is None else len(states),
        team.pk if isinstance(team, Team) else team is None,
        mine,
        bool(name_contains),
    )
    values = (
        getattr(user, "pk", None),
        *(states or ()),
        *((team,) if isinstance(team, str) else ()),
        # A value still, though the LIKE pattern made of it is none the cache can fill: so
        # that shape is found uncacheable rather than compiled with one search in it.
        *((name_contains,) if name_contains else ()),
    )
    return JobListShape(
        key=key,
        values=values,
        user=user,
        states=states,
        team=team,
        mine=mine,
        name_contains=name_contains,
    )


def job_get_for_user(*, user: Any, job_id: int) -> Job:
    """The job ``job_id`` if ``user`` may see it; ``Job.DoesNotExist`` otherwise.

    A job of another team is reported exactly like a missing one, so ids reveal nothing.
    """
    return job_list_for_user(user=user).get(pk=job_id)


def job_log(*, job: Job, attempt: int | None = None) -> str:
    """The output of one attempt of ``job`` (its latest when ``attempt`` is None), in order
    (of a multi-node gang: its first node's, rank 0)."""
    if attempt is None:
        attempt = job.attempt
    chunks = JobLogChunk.objects.filter(job=job, attempt=attempt, part=0).order_by("seq")
    return "".join(chunks.values_list("data", flat=True))


@dataclass(frozen=True)
class LogTail:
    """What a reader that follows a log gets: the text after its offset and where to go on."""

    text: str
    next_offset: int  # the bytes (UTF-8) of the log counted so far: the next read starts here
    ended: bool  # the attempt is over: nothing more will be added, the reader can stop


class _OctetLength(Func):
    """A text's length in bytes (UTF-8), counted by the database."""

    function = "OCTET_LENGTH"
    output_field = IntegerField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))", **extra
        )


def job_log_after(*, job: Job, attempt: int, offset: int) -> LogTail:
    """The output of one attempt of ``job`` after its first ``offset`` bytes, so a reader
    follows a log without fetching it whole each time (two queries: the chunks' sizes, then
    the text of those past ``offset``).

    While the attempt runs, only the chunks numbered from 0 without a gap count: reports may
    be handled out of order, and a chunk that arrives late must not land behind an offset a
    reader already moved past. Once the attempt is over (the job ended, or went on to a later
    attempt) every chunk that arrived counts. An ``offset`` beyond the log gives no text and
    ``next_offset`` smaller than ``offset``.
    """
    ended = attempt < job.attempt or job.state in TERMINAL_STATES
    chunks = JobLogChunk.objects.filter(job=job, attempt=attempt, part=0).order_by("seq")
    sizes = chunks.annotate(size=_OctetLength("data")).values_list("seq", "size")
    end = skip = 0
    first_seq: int | None = None
    last_seq = -1
    for expected, (seq, size) in enumerate(sizes):
        if seq != expected and not ended:
            break
        if first_seq is None and end + size > offset:
            first_seq, skip = seq, offset - end
        end += size
        last_seq = seq
    if first_seq is None:
        return LogTail(text="", next_offset=end, ended=ended)
    data = "".join(
        chunks.filter(seq__gte=first_seq, seq__lte=last_seq).values_list("data", flat=True)
    )
    # errors="replace": an offset a client chose may cut a character in two.
    return LogTail(text=data.encode()[skip:].decode(errors="replace"), next_offset=end, ended=ended)


def job_slices(*, job: Job) -> list[dict[str, Any]]:
    """The slices the job's latest attempt holds (or held), for people and the API."""
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


# --- teams: what their jobs hold ------------------------------------------------------------


def team_overview(*, team: Team) -> dict[str, Any]:
    """Quota, what the team holds now, its job counts and its members."""
    return team_overviews(teams=[team])[0]


def team_overviews(*, teams: Iterable[Team]) -> list[dict[str, Any]]:
    """``team_overview`` for many teams in a fixed number of queries (three), not per team."""
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
                "allowed_image_prefixes": list(team.image_prefixes()),
                "job_network": team.job_network,
                "read_only_rootfs": team.read_only_rootfs,
                "units_in_use": round(units_in_use.get(team.pk) or 0.0, 6),
                "running_jobs": row.get("running", 0),
                "pending_jobs": row.get("pending", 0),
                "held_jobs": row.get("held", 0),
                "members": sorted(members[team.pk], key=lambda m: m["username"]),
            }
        )
    return overviews


def team_usage(*, team: Team, now: datetime) -> dict[str, Any]:
    """A team's usage as fair share and its page see it at ``now``.

    ``decayed_unit_seconds`` includes what its running jobs used so far; ``units_in_use`` is
    what it holds now (raw GPU units); ``gpu_hours_this_month`` counts the budget period.
    """
    config = scheduler_config()
    half_life = config.usage_half_life_s
    at = now.timestamp()
    period_start = budget_period_start(now).timestamp()
    balance = UsageBalance.objects.filter(team=team, user__isnull=True).first()
    decayed = (
        balance_at(balance.unit_seconds, balance.as_of.timestamp(), at, half_life)
        if balance
        else 0.0
    )
    held = Allocation.objects.filter(
        released_at__isnull=True, job__team=team, job__state__in=HOLDING_STATES
    ).values_list("job_id", "slice__units", "slice__gpu__model", "created_at")
    raw_units = 0.0
    billed_by_job: dict[int, float] = defaultdict(float)
    held_from: dict[int, float] = {}
    for job_id, units, model, created_at in held:
        raw_units += units
        billed_by_job[job_id] += billed_units(units, model, config.model_weights)
        held_from[job_id] = created_at.timestamp()
    running_hours = 0.0
    for job_id, units in billed_by_job.items():
        decayed += hold_charge(units, held_from[job_id], at)
        running_hours += units * max(0.0, at - max(held_from[job_id], period_start)) / 3600.0
    finished_hours = gpu_hours_in_period(now=now, team_id=team.pk).get(team.pk, 0.0)
    return {
        "team": team.name,
        "as_of": now,
        "decayed_unit_seconds": decayed,
        "half_life_s": half_life,
        "units_in_use": raw_units,
        "gpu_hours_this_month": finished_hours + running_hours,
        "budget_gpu_hours": team.budget_gpu_hours,
    }
