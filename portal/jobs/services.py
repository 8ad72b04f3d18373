"""Writes about jobs: submit, cancel, hold, release and resubmit.

Every state change goes through ``portal.jobs.transitions.transition`` (a guarded UPDATE plus
an event). Scheduling never happens here: a submit asks for a pass after commit, and a cancel
of a running job asks its attempt to stop (``portal.jobs.attempts``) and the agent to stop
it after commit; the agent's ``finished`` report moves the job to CANCELLED and frees its
slices.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.utils import timezone

from portal import agent_messages
from portal.jobs.attempts import (
    StopAsked,
    StopWanted,
    attempt_request_stop,
    attempt_request_stops,
)
from portal.jobs.models import HOLDING_STATES, TERMINAL_STATES, Job, JobDependency, JobState
from portal.jobs.transitions import (
    Move,
    insert_submitted_job,
    record_event,
    record_submissions,
    transition,
    transition_many,
)
from portal.jobs.validation import JobRequest, validate_job_request
from portal.passes import schedule_pass_on_commit
from portal.tenants.models import Membership
from portal.tenants.selectors import is_site_admin

log = logging.getLogger("portal.jobs")

# A state change may race with the scheduler or an agent report; retry this often on a moved
# state before giving up.
_RACE_RETRIES = 3
_CLEARED_EXPLANATION = {
    "pending_code": "",
    "pending_message": "",
    "pending_numbers": {},
    "queue_position": None,
    "estimated_start_at": None,
    "estimated_start_earliest_at": None,
    "estimated_start_latest_at": None,
}


# The states job_cancel acts on (PREEMPTED and LOST are about to be requeued: cancel after).
CANCELLABLE_STATES = frozenset({JobState.PENDING, JobState.HELD, *HOLDING_STATES})


class JobActionError(Exception):
    """An action the job's state does not allow (cancelling a finished job, ...)."""


@dataclass(frozen=True, slots=True)
class ArrayMember:
    """Where one job of a submit goes in a job array (``portal.jobs.arrays``): the array, the
    member's index, and its whole env (the request's, plus its sweep's values)."""

    array_id: int
    index: int
    env: Mapping[str, str]


def submission_message(*, user: Any, request: JobRequest) -> str:
    """The message of a submitted job's first event (an array's members add their place)."""
    return "; ".join((f"submitted by {user.get_username()}", *request.notes))


def job_submit(*, user: Any, request: JobRequest, member: ArrayMember | None = None) -> Job:
    """Store a validated request as a PENDING job and ask for a scheduling pass on commit."""
    return jobs_submit(user=user, request=request, members=[member])[0]


def jobs_submit(
    *, user: Any, request: JobRequest, members: Sequence[ArrayMember | None]
) -> list[Job]:
    """``job_submit`` for one job per entry of ``members`` (None: a job of no array), all in
    one transaction and a few statements whatever their number (an array's members)."""
    now = timezone.now()
    jobs = [_new_job(user=user, request=request, member=member, now=now) for member in members]
    message = submission_message(user=user, request=request)
    if (
        len(jobs) == 1
        and jobs[0].array_id is None
        and not request.depends_on
        and connection.vendor == "postgresql"
        and not connection.in_atomic_block
    ):
        # The common submit (one job, nothing to wait for): the job and its event in one
        # statement, which is a transaction of its own, instead of BEGIN, two INSERTs and
        # COMMIT (four round trips). A caller's transaction keeps the path below.
        insert_submitted_job(jobs[0], at=now, message=message)
        schedule_pass_on_commit()  # no transaction open: asked at once, as after a commit
    else:
        with transaction.atomic():
            jobs = Job.objects.bulk_create(jobs)
            JobDependency.objects.bulk_create(
                JobDependency(job=job, depends_on_id=dependency.job_id, kind=dependency.kind)
                for job in jobs
                for dependency in request.depends_on
            )
            record_submissions(
                [
                    (
                        job.pk,
                        message
                        if job.array_id is None
                        else f"{message}; member {job.array_index} of array {job.array_id}",
                    )
                    for job in jobs
                ],
                at=now,
            )
            schedule_pass_on_commit()
    if len(jobs) == 1:
        log.info("job %s submitted by %s to team %s", jobs[0].pk, user, request.team.name)
    else:
        log.info("%s jobs submitted by %s to team %s", len(jobs), user, request.team.name)
    return jobs


def _new_job(*, user: Any, request: JobRequest, member: ArrayMember | None, now: Any) -> Job:
    gpu = request.gpu
    return Job(
        team=request.team,
        user=user,
        name=request.name,
        image=request.image,
        command=list(request.command),
        env=dict(request.env if member is None else member.env),
        gpu_kind=gpu.kind.value,
        gpu_count=gpu.count,
        gpu_min_count=gpu.min_count,
        gpu_profile=gpu.profile,
        gpu_model=gpu.model,
        multi_node=gpu.multi_node,
        priority=request.priority,
        time_limit_s=request.time_limit_s,
        preemptible=request.preemptible,
        notify=None if request.notify is None else list(request.notify),
        array_id=None if member is None else member.array_id,
        array_index=None if member is None else member.index,
        state=JobState.PENDING,
        attempt=0,
        submitted_at=now,
        queued_since=now,
    )


@dataclass(frozen=True)
class JobActor:
    """What one user may do to jobs, read once (one query) for a whole page of them.

    The rule: a job's owner while a member of its team, an admin of its team, a site admin.
    """

    user_id: int | None
    site_admin: bool = False
    member_of: frozenset[int] = frozenset()  # team ids
    admin_of: frozenset[int] = frozenset()

    def may_act(self, job: Job) -> bool:
        if self.site_admin:
            return True
        if self.user_id is not None and job.user_id == self.user_id:
            return job.team_id in self.member_of
        return job.team_id in self.admin_of


def job_actor(*, user: Any) -> JobActor:
    if is_site_admin(user):
        return JobActor(user_id=user.pk, site_admin=True)
    if not getattr(user, "is_authenticated", False):
        return JobActor(user_id=None)
    roles = list(Membership.objects.filter(user=user).values_list("team_id", "role"))
    return JobActor(
        user_id=user.pk,
        member_of=frozenset(team for team, _ in roles),
        admin_of=frozenset(team for team, role in roles if role == Membership.Role.ADMIN),
    )


def can_act_on_job(*, user: Any, job: Job) -> bool:
    """Who may cancel, hold, release or resubmit a job (see ``JobActor``)."""
    return job_actor(user=user).may_act(job)


@dataclass(frozen=True)
class JobActions:
    """The actions the services below would accept now, for one job and one user: a page
    shows a button only for these."""

    cancel: bool = False
    hold: bool = False
    release: bool = False
    resubmit: bool = False

    def __bool__(self) -> bool:
        return self.cancel or self.hold or self.release or self.resubmit


def job_actions_for(*, job: Job, actor: JobActor) -> JobActions:
    if not actor.may_act(job):
        return JobActions()
    # A cancel already asked of a running job is not offered again.
    cancel_asked = (
        job.state in HOLDING_STATES
        and job.stop_requested_at is not None
        and job.stop_reason == "cancel"
    )
    return JobActions(
        cancel=job.state in CANCELLABLE_STATES and not cancel_asked,
        hold=job.state == JobState.PENDING,
        release=job.state == JobState.HELD,
        resubmit=job.state in TERMINAL_STATES,
    )


def job_cancel(*, job: Job, user: Any) -> Job:
    """Cancel ``job``: at once when it waits, through its agent when it holds slices.

    Raises ``PermissionDenied`` when ``user`` may not, ``JobActionError`` when the job ended.
    """
    _check_may_act(job=job, user=user, verb="cancel")
    who = user.get_username()
    for _ in range(_RACE_RETRIES):
        state = Job.objects.filter(pk=job.pk).values_list("state", flat=True).get()
        if state in (JobState.PENDING, JobState.HELD):
            if _cancel_waiting(job, who):
                break
        elif state in HOLDING_STATES:
            if _request_cancel_stop(job, who):
                break
        elif state in (JobState.PREEMPTED, JobState.LOST):
            raise JobActionError(
                f"job {job.pk} is {state} and about to be requeued; cancel it again in a few seconds"
            )
        else:
            raise JobActionError(f"job {job.pk} already ended ({state}); nothing to cancel")
    else:
        raise JobActionError(f"job {job.pk} keeps changing state; try again")
    job.refresh_from_db()
    return job


def _cancel_waiting(job: Job, who: str) -> bool:
    now = timezone.now()
    left = transition(
        job.pk,
        to=JobState.CANCELLED,
        from_states=[JobState.PENDING, JobState.HELD],
        message=f"cancelled by {who}",
        at=now,
        finished_at=now,
        reason=f"cancelled by {who}",
        **_CLEARED_EXPLANATION,
    )
    return left is not None


def _request_cancel_stop(job: Job, who: str) -> bool:
    """Ask the attempt of a job that holds slices to stop for a cancel; send the stop after
    commit.

    Asking twice is harmless: the request is written once, and the stop message is sent again
    (the agent ignores a stop for a job it already stopped), which also covers a lost message.
    """
    with transaction.atomic():
        asked = attempt_request_stop(
            job_id=job.pk, reason="cancel", message=f"cancel requested by {who}"
        )
        if asked == StopAsked.NOT_HOLDING:
            return False  # it left ASSIGNED/RUNNING meanwhile: look again
        transaction.on_commit(lambda: agent_messages.request_stops([job.pk]))
    return True


class _Moved(Exception):
    """A job of a batch left the state the batch was for: roll the batch back."""


_CANCEL_COLUMNS = ("finished_at", "reason", *_CLEARED_EXPLANATION)


def jobs_cancel(*, jobs: Sequence[Job], user: Any) -> list[int]:
    """``job_cancel`` for many jobs (a job array's members) in a few statements: the waiting
    ones with one guarded UPDATE per state, the ones holding slices with one stop request
    for all. A job that moved meanwhile goes through ``job_cancel`` alone; one that ended
    (or is about to be requeued) is left as it is. Returns the ids cancelled or asked to
    stop. Raises ``PermissionDenied`` when ``user`` may not act on one of ``jobs``.
    """
    actor = job_actor(user=user)
    refused = next((job for job in jobs if not actor.may_act(job)), None)
    if refused is not None:
        _check_may_act(job=refused, user=user, verb="cancel")  # raises, saying who may
    who = user.get_username()
    now = timezone.now()
    by_state: dict[str, list[tuple[int, int]]] = {}
    rows = Job.objects.filter(pk__in=[job.pk for job in jobs]).values_list("pk", "state", "attempt")
    for pk, state, attempt in rows:
        by_state.setdefault(state, []).append((pk, attempt))
    done: list[int] = []
    alone: list[int] = []
    for state in (JobState.PENDING, JobState.HELD):
        group = by_state.get(state, [])
        reason = f"cancelled by {who}"
        moves = [
            Move(pk, attempt, reason, (now, reason, *_CLEARED_EXPLANATION.values()))
            for pk, attempt in group
        ]
        try:
            with transaction.atomic():
                if not transition_many(
                    moves, to=JobState.CANCELLED, from_state=state, columns=_CANCEL_COLUMNS, at=now
                ):
                    raise _Moved
        except _Moved:
            alone += [pk for pk, _ in group]
        else:
            done += [pk for pk, _ in group]
    holding = [pk for state in HOLDING_STATES for pk, _ in by_state.get(state, [])]
    if holding:
        message = f"cancel requested by {who}"
        with transaction.atomic():
            found = attempt_request_stops(
                wanted=[StopWanted(job_id=pk, message=message) for pk in holding],
                reason="cancel",
                at=now,
            )
            asked = [pk for pk, what in found.items() if what != StopAsked.NOT_HOLDING]
            transaction.on_commit(lambda: agent_messages.request_stops(asked))
        done += asked
        alone += [pk for pk, what in found.items() if what == StopAsked.NOT_HOLDING]
    by_pk = {job.pk: job for job in jobs}
    for pk in alone:
        try:
            job_cancel(job=by_pk[pk], user=user)
        except JobActionError:
            continue  # it ended meanwhile, or is about to be requeued
        done.append(pk)
    return sorted(done)


def job_hold(*, job: Job, user: Any) -> Job:
    """Keep a PENDING job from being scheduled until it is released."""
    _check_may_act(job=job, user=user, verb="hold")
    left = transition(
        job.pk,
        to=JobState.HELD,
        from_states=[JobState.PENDING],
        message=f"held by {user.get_username()}",
        **_CLEARED_EXPLANATION,
    )
    if left is None:
        state = Job.objects.filter(pk=job.pk).values_list("state", flat=True).get()
        raise JobActionError(f"job {job.pk} is {state}; only a PENDING job can be held")
    job.refresh_from_db()
    return job


def job_release(*, job: Job, user: Any) -> Job:
    """Put a HELD job back in the queue, at the end: holding does not keep a place."""
    _check_may_act(job=job, user=user, verb="release")
    with transaction.atomic():
        left = transition(
            job.pk,
            to=JobState.PENDING,
            from_states=[JobState.HELD],
            message=f"released by {user.get_username()}",
            queued_since=timezone.now(),
        )
        if left is None:
            state = Job.objects.filter(pk=job.pk).values_list("state", flat=True).get()
            raise JobActionError(f"job {job.pk} is {state}; only a HELD job can be released")
        schedule_pass_on_commit()
    job.refresh_from_db()
    return job


def job_resubmit(*, job: Job, user: Any, request: JobRequest | None = None) -> Job:
    """Submit a new job with the request of ``job``, which ended, as ``user`` (in the same
    job array at the same index, for a member of one).

    The request is checked again like any submit (the team's limits or the user's teams may
    have changed since); both jobs get an event naming the other. ``request`` is that request
    as the person edited it (the submit form, filled from ``job``); it was validated already.
    """
    _check_may_act(job=job, user=user, verb="resubmit")
    state = Job.objects.filter(pk=job.pk).values_list("state", flat=True).get()
    if state not in TERMINAL_STATES:
        ended = ", ".join(sorted(TERMINAL_STATES))
        raise JobActionError(
            f"job {job.pk} is {state}; only an ended job ({ended}) can be resubmitted"
        )
    if request is None:
        request = validate_job_request(job_request_of(job), user=user)
    # A member of a job array stays one, at its index (its array's throttle counts it).
    member = (
        None
        if job.array_id is None or job.array_index is None
        else ArrayMember(array_id=job.array_id, index=job.array_index, env=request.env)
    )
    with transaction.atomic():
        new = job_submit(user=user, request=request, member=member)
        who = user.get_username()
        record_event(job.pk, message=f"resubmitted by {who} as job {new.pk}", attempt=job.attempt)
        record_event(new.pk, message=f"resubmitted from job {job.pk}", attempt=0)
    return new


def job_request_of(job: Job) -> dict[str, Any]:
    """A stored job's request, in the shape a submit sends (the API's JSON)."""
    gpu: dict[str, Any] = {"kind": job.gpu_kind, "count": job.gpu_count}
    if job.gpu_min_count:
        gpu["min_count"] = job.gpu_min_count
    if job.gpu_profile:
        gpu["profile"] = job.gpu_profile
    if job.gpu_model:
        gpu["model"] = job.gpu_model
    if job.multi_node:
        gpu["multi_node"] = True
    return {
        "name": job.name,
        "team": job.team.name,
        "image": job.image,
        "command": list(job.command),
        "env": dict(job.env),
        "gpu": gpu,
        "priority": job.priority,
        "time_limit_s": job.time_limit_s,
        "preemptible": job.preemptible,
        "depends_on": [
            {"job": dependency.depends_on_id, "kind": dependency.kind}
            for dependency in job.dependencies.all()
        ],
        "notify": job.notify,
    }


def _check_may_act(*, job: Job, user: Any, verb: str) -> None:
    if not can_act_on_job(user=user, job=job):
        raise PermissionDenied(
            f"only the job's owner, an admin of team {job.team.name} or a site admin "
            f"may {verb} job {job.pk}"
        )
