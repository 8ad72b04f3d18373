"""Job arrays (sweeps): one submit makes N jobs of one request, like Slurm's ``--array``.

A request with ``"array": {"count": 100}`` makes members 0..99; with ``"array": {"values":
{"lr": [0.1, 0.01], "bs": [32, 64]}}`` one member per combination of the values, in the
order of ``itertools.product``: the names in the order the request gives them, the last
name varying fastest (0: lr=0.1 bs=32, 1: lr=0.1 bs=64, 2: lr=0.01 bs=32, 3: lr=0.01
bs=64). Member ``i`` gets ``PORTAL_ARRAY_ID`` and ``PORTAL_ARRAY_INDEX=i`` when it is
launched (``portal.agents.dispatch.launch_env``) and, for a sweep, its values as env
variables of those names (stored in its ``env``). ``"max_running": 4`` lets at most 4
members hold slices at once (Slurm's ``%4``; the scheduling core's ``scheduler.arrays``).

The members are made by ``portal.jobs.services.jobs_submit``, the path of every submit, in
one transaction with the array. The request is validated once, by ``validate_job_request``
(everything but ``array``) and here (``array``); a bad spec is refused with every problem
at once, keyed ``array.count``, ``array.values.<name>``, ``array.max_running``, and
nothing is stored.

A member's job may be resubmitted: the new job takes its index, and is the array's member
for that index from then on (``array_view``; the job it replaced stays, listed apart).
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.db.models import prefetch_related_objects
from django.utils import timezone

from portal.jobs.models import Job, JobArray, JobState
from portal.jobs.services import (
    ArrayMember,
    JobActor,
    job_actions_for,
    job_actor,
    job_request_of,
    jobs_cancel,
    jobs_submit,
)
from portal.jobs.transitions import Note, record_events
from portal.jobs.validation import (
    ENV_KEY_RE,
    RESERVED_ENV_HELP,
    RESERVED_ENV_KEYS,
    RESERVED_ENV_PREFIXES,
    JobRequest,
    JobRequestError,
    _integer,
    validate_job_request,
)
from portal.tenants.selectors import teams_for_user

ARRAY_FIELDS = ("count", "values", "max_running")
ARRAY_EXAMPLE = '{"count": 10, "max_running": 4} or {"values": {"lr": [0.1, 0.01]}}'
# The end states "resubmit failed" starts again (a cancelled member was stopped on purpose).
RESUBMIT_STATES = (JobState.FAILED, JobState.TIMED_OUT)


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """A checked ``array``: its size, the swept values (names with their values as env
    strings, in product order; empty for a plain count) and the throttle."""

    size: int
    values: tuple[tuple[str, tuple[str, ...]], ...] = ()
    max_running: int | None = None

    def combinations(self) -> list[dict[str, str]]:
        """Each member's swept values, by index."""
        if not self.values:
            return [{} for _ in range(self.size)]
        names = [name for name, _ in self.values]
        return [
            dict(zip(names, combination, strict=True))
            for combination in itertools.product(*(values for _, values in self.values))
        ]


@dataclass(frozen=True, slots=True)
class ArrayRequest:
    job: JobRequest
    spec: ArraySpec


def validate_array_request(data: Mapping[str, Any], *, user: Any) -> ArrayRequest:
    """Check a submit with an ``array``: the job's fields as any submit, then the spec."""
    if not isinstance(data, Mapping):
        raise JobRequestError({"request": "must be a JSON object with the job's fields"})
    errors: dict[str, str] = {}
    job: JobRequest | None = None
    try:
        job = validate_job_request({k: v for k, v in data.items() if k != "array"}, user=user)
    except JobRequestError as error:
        errors.update(error.errors)
    env = job.env if job is not None else data.get("env")
    spec = _spec(data.get("array"), set(env) if isinstance(env, Mapping) else set(), errors)
    if errors:
        raise JobRequestError(errors)
    assert job is not None and spec is not None  # no errors means both were set
    return ArrayRequest(job=job, spec=spec)


def _spec(value: Any, env_names: set[str], errors: dict[str, str]) -> ArraySpec | None:
    if not isinstance(value, Mapping):
        errors["array"] = f"must be an object such as {ARRAY_EXAMPLE}"
        return None
    before = len(errors)
    for key in value:
        if key not in ARRAY_FIELDS:
            errors[f"array.{key}"] = f"unknown field; allowed: {', '.join(ARRAY_FIELDS)}"
    maximum = settings.ARRAY_MAX
    given = [key for key in ("count", "values") if value.get(key) not in (None, "")]
    size: int | None = None
    values: tuple[tuple[str, tuple[str, ...]], ...] = ()
    if len(given) != 1:
        shown = "give one of them, not both" if given else "required"
        errors["array"] = f"count or values: {shown}; e.g. {ARRAY_EXAMPLE}"
    elif given == ["count"]:
        size = _integer(value["count"], "array.count", errors, low=1, high=maximum)
    else:
        values = _values(value["values"], env_names, errors)
        size = math.prod(len(items) for _, items in values) if values else None
        if size is not None and size > maximum:
            sizes = " x ".join(str(len(items)) for _, items in values)
            errors["array.values"] = (
                f"{sizes} = {size} combinations is too many; allowed: at most {maximum} "
                "(PORTAL_ARRAY_MAX)"
            )
    max_running = None
    if value.get("max_running") not in (None, ""):
        max_running = _integer(
            value["max_running"], "array.max_running", errors, low=1, high=maximum
        )
    if len(errors) > before or size is None:
        return None
    return ArraySpec(size=size, values=values, max_running=max_running)


def _values(
    value: Any, env_names: set[str], errors: dict[str, str]
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    shape = 'an object of NAME: [value, ...], e.g. {"lr": [0.1, 0.01], "bs": [32, 64]}'
    if not isinstance(value, Mapping) or not value:
        errors["array.values"] = f"must be {shape}"
        return ()
    swept: list[tuple[str, tuple[str, ...]]] = []
    for name, items in value.items():
        field = f"array.values.{name}"
        if not isinstance(name, str) or not ENV_KEY_RE.match(name):
            errors[field] = (
                f"{name!r} is not an env variable name; allowed: names matching "
                "[A-Za-z_][A-Za-z0-9_]*"
            )
            continue
        if name in RESERVED_ENV_KEYS or name.startswith(RESERVED_ENV_PREFIXES):
            errors[field] = f"{name} is reserved: the portal sets {RESERVED_ENV_HELP}"
            continue
        if name in env_names:
            errors[field] = f"{name} is also in env; allowed: a name the job's env does not set"
            continue
        texts = _texts(items, field, errors)
        if texts is not None:
            swept.append((name, texts))
    return tuple(swept)


def _texts(items: Any, field: str, errors: dict[str, str]) -> tuple[str, ...] | None:
    """The values of one name as env strings (numbers as JSON writes them, booleans as
    true/false)."""
    allowed = "a non-empty list of distinct strings, numbers or booleans"
    if not isinstance(items, Sequence) or isinstance(items, str) or not items:
        errors[field] = f"must be {allowed}"
        return None
    texts: list[str] = []
    for item in items:
        if isinstance(item, bool):
            text = "true" if item else "false"
        elif isinstance(item, int | float) and math.isfinite(item):
            text = json.dumps(item)
        elif isinstance(item, str) and "\x00" not in item:
            text = item
        else:
            errors[field] = f"{item!r} is not allowed; allowed: {allowed}"
            return None
        if text in texts:
            errors[field] = f"{text!r} is listed twice; allowed: {allowed}"
            return None
        texts.append(text)
    return tuple(texts)


# --- writes -----------------------------------------------------------------------------


def array_submit(*, user: Any, request: ArrayRequest) -> tuple[JobArray, list[Job]]:
    """Store the array and its members (PENDING), in one transaction; a pass after commit."""
    job, spec = request.job, request.spec
    with transaction.atomic():
        array = JobArray.objects.create(
            team=job.team,
            user=user,
            name=job.name,
            size=spec.size,
            max_running=spec.max_running,
            values=[[name, list(items)] for name, items in spec.values],
            created_at=timezone.now(),
        )
        members = [
            ArrayMember(array_id=array.pk, index=index, env={**job.env, **values})
            for index, values in enumerate(spec.combinations())
        ]
        jobs = jobs_submit(user=user, request=job, members=members)
    return array, jobs


def array_cancel(*, array: JobArray, user: Any) -> list[int]:
    """Cancel every member that can be (``jobs_cancel``); the ids cancelled or asked to stop."""
    members = array_view(array=array).members
    actor = job_actor(user=user)
    _check_may_act(array, actor, members, verb="cancel")
    cancellable = [job for job in members if job_actions_for(job=job, actor=actor).cancel]
    return jobs_cancel(jobs=cancellable, user=user)


@dataclass(frozen=True, slots=True)
class Resubmitted:
    index: int
    from_job: int
    job: int


def array_resubmit_failed(*, array: JobArray, user: Any) -> list[Resubmitted]:
    """A new job for each member that ended FAILED or TIMED_OUT, at its index, each request
    checked again like any resubmit; none for the others. Two at once make no duplicates:
    the second finds the new jobs (PENDING) as the members."""
    who = user.get_username()
    with transaction.atomic():
        _lock(array)
        members = array_view(array=array).members
        _check_may_act(array, job_actor(user=user), members, verb="resubmit")
        failed = [job for job in members if job.state in RESUBMIT_STATES]
        prefetch_related_objects(failed, "dependencies")
        done: list[Resubmitted] = []
        for request, jobs in _by_request(failed, user=user):
            members = [
                ArrayMember(array_id=array.pk, index=_index(job), env=job.env) for job in jobs
            ]
            new = jobs_submit(user=user, request=request, members=members)
            done += [
                Resubmitted(index=_index(old), from_job=old.pk, job=job.pk)
                for old, job in zip(jobs, new, strict=True)
            ]
            notes = [
                Note(old.pk, old.state, old.attempt, f"resubmitted by {who} as job {job.pk}")
                for old, job in zip(jobs, new, strict=True)
            ]
            notes += [
                Note(job.pk, JobState.PENDING, 0, f"resubmitted from job {old.pk}")
                for old, job in zip(jobs, new, strict=True)
            ]
            record_events(notes, at=timezone.now())
    return sorted(done, key=lambda r: r.index)


def _by_request(jobs: Sequence[Job], *, user: Any) -> list[tuple[JobRequest, list[Job]]]:
    """The jobs grouped by their request but the env (one validation per group: an array's
    members differ only there, unless one was resubmitted with changes)."""
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        data = job_request_of(job)
        del data["env"]
        groups.setdefault(json.dumps(data, sort_keys=True, default=str), []).append(job)
    return [
        (validate_job_request(job_request_of(group[0]), user=user), group)
        for group in groups.values()
    ]


def _lock(array: JobArray) -> None:
    """Serialise writers of one array (SQLite's IMMEDIATE transactions already do)."""
    rows = JobArray.objects.filter(pk=array.pk)
    if connection.features.has_select_for_update:
        rows = rows.select_for_update()
    list(rows.values_list("pk"))


def _check_may_act(array: JobArray, actor: JobActor, jobs: Sequence[Job], *, verb: str) -> None:
    """The rule of ``JobActor``, for an array's members (one owner and team for all)."""
    if any(not actor.may_act(job) for job in jobs):
        raise PermissionDenied(
            f"only the array's owner, an admin of team {array.team.name} or a site admin "
            f"may {verb} the jobs of array {array.pk}"
        )


def _index(job: Job) -> int:
    assert job.array_index is not None  # every member has one
    return job.array_index


# --- reads ------------------------------------------------------------------------------


def array_get_for_user(*, user: Any, array_id: int) -> JobArray:
    """The array if ``user`` may see its team's jobs; ``JobArray.DoesNotExist`` otherwise
    (another team's array is reported exactly like a missing one)."""
    return (
        JobArray.objects.filter(team__in=teams_for_user(user=user))
        .select_related("team", "user")
        .get(pk=array_id)
    )


@dataclass(frozen=True)
class ArrayView:
    """An array as people and scripts look at it."""

    array: JobArray
    members: list[Job]  # the newest job of each index, by index
    replaced: list[Job]  # jobs that a resubmit replaced, by index, newest first
    counts: dict[str, int]  # members by state, every state listed

    @property
    def names(self) -> list[str]:
        """The swept names, in product order."""
        return [name for name, _ in self.array.values]

    def values_of(self, job: Job) -> dict[str, str]:
        """A member's swept values (from its env)."""
        env = job.env or {}
        return {name: str(env.get(name, "")) for name in self.names}


def array_view(*, array: JobArray) -> ArrayView:
    """The array's members now, and the jobs they replaced (one query)."""
    current: dict[int, Job] = {}
    replaced: list[Job] = []
    jobs = (
        Job.objects.filter(array=array)
        .select_related("team", "user", "node")
        .order_by("array_index", "-pk")
    )
    for job in jobs:
        index = _index(job)
        if index in current:
            replaced.append(job)
        else:
            current[index] = job
    members = [current[index] for index in sorted(current)]
    counts = Counter(job.state for job in members)
    return ArrayView(
        array=array,
        members=members,
        replaced=replaced,
        counts={state: counts.get(state, 0) for state in JobState.values},
    )
