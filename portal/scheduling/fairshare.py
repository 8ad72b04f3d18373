"""Store the fair-share numbers of a pass (``Decisions.standing``), replacing the last pass's.

What Slurm's ``sshare -l`` and ``sprio`` show, as the core used them: per team, per member,
and per pending job its priority parts (``scheduler.standing``). Written inside the pass's
transaction, so a reader sees one pass's numbers, never a mix. Each table is emptied with
one DELETE and refilled with one INSERT per few thousand rows (``portal.bulk``): a fixed
number of statements whatever the size of the queue. Every row changes from pass to pass
anyway (usage decays and grows, waiting jobs age), so there is nothing to gain from
comparing.

They are what the pages show, dated by ``FairSharePass.as_of``, so a pass within
``PORTAL_FAIRSHARE_STORE_S`` (2 s: beat's interval) of the stored numbers leaves them: under
a stream of submits passes run every half second or so, and rewriting a row per pending job
each time (about 65 ms a pass at 4,400 pending) bought numbers fresher than anyone reads.
A job submitted since shows none until the next store (``job_priority`` says so).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model

from portal.bulk import insert_rows
from portal.scheduling.models import FairShareMember, FairSharePass, FairShareTeam, JobPriority
from portal.scheduling.snapshot import LoadedSnapshot
from portal.tenants.models import Team
from scheduler.model import Pending
from scheduler.standing import Standing

_TEAM_COLUMNS = (
    "team",
    "weight",
    "guaranteed_units",
    "usage_unit_seconds",
    "held_units",
    "effective_units",
    "effective_end_units",
    "fair_units",
    "factor",
    "factor_end",
    "rank",
)
_MEMBER_COLUMNS = (
    "team",
    "user",
    "usage_unit_seconds",
    "held_units",
    "effective_units",
    "effective_end_units",
    "fair_units",
    "factor",
    "factor_end",
    "rank",
)
_JOB_COLUMNS = (
    "job",
    "priority",
    "class_rank",
    "within_guarantee",
    "team_factor",
    "user_factor",
    "age_boost",
)


def store_standing(
    standing: Standing | None, pending: Iterable[Pending], *, loaded: LoadedSnapshot
) -> int:
    """Replace the stored fair-share numbers with this pass's (none when the pass kept no
    standing: the FIFO policies); the priority rows written, one per pending job the fair
    queues ordered; 0 when the stored numbers are recent enough (see the module's docstring)."""
    if standing is not None and _stored_lately(loaded.now):
        return 0
    for model in (JobPriority, FairShareMember, FairShareTeam, FairSharePass):
        model.objects.all().delete()
    if standing is None:
        return 0
    FairSharePass.objects.create(
        pk=1,
        as_of=loaded.now,
        capacity_units=standing.capacity,
        scale_units=standing.scale,
        history_per_unit=standing.history_per_unit,
        aging_per_hour=standing.aging_per_hour,
    )
    team_pks = dict(
        Team.objects.filter(name__in=[t.team for t in standing.teams]).values_list("name", "pk")
    )
    insert_rows(
        FairShareTeam,
        _TEAM_COLUMNS,
        [
            (
                team_pks[t.team],
                t.weight,
                t.guaranteed,
                t.usage,
                t.held,
                t.effective,
                t.effective_end,
                t.fair,
                t.factor,
                t.factor_end,
                t.rank,
            )
            for t in standing.teams
            if t.team in team_pks
        ],
    )
    user_pks = dict(
        get_user_model()
        .objects.filter(username__in={u.user for u in standing.users})
        .values_list("username", "pk")
    )
    insert_rows(
        FairShareMember,
        _MEMBER_COLUMNS,
        [
            (
                team_pks[u.team],
                user_pks[u.user],
                u.usage,
                u.held,
                u.effective,
                u.effective_end,
                u.fair,
                u.factor,
                u.factor_end,
                u.rank,
            )
            for u in standing.users
            if u.team in team_pks and u.user in user_pks
        ],
    )
    priorities = standing.priorities()
    rows = []
    for decision in pending:
        parts = priorities.get(decision.job_id)
        if parts is not None and int(decision.job_id) in loaded.pending:
            rows.append(
                (
                    int(decision.job_id),
                    parts.priority,
                    parts.class_rank,
                    parts.within_guarantee,
                    parts.team_factor,
                    parts.user_factor,
                    parts.age_boost,
                )
            )
    insert_rows(JobPriority, _JOB_COLUMNS, rows)
    return len(rows)


def _stored_lately(now: datetime) -> bool:
    """Whether the stored numbers are of a pass less than ``PORTAL_FAIRSHARE_STORE_S`` before
    ``now`` (numbers dated after ``now``, from a clock that went back, are replaced)."""
    window = settings.FAIRSHARE_STORE_S
    if window <= 0:
        return False
    return FairSharePass.objects.filter(
        pk=1, as_of__gt=now - timedelta(seconds=window), as_of__lte=now
    ).exists()
