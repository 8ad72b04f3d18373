"""Writes about notifications: people's and teams' settings, and the deliveries a job state
change makes.

``notify_state_changes`` receives ``portal.jobs.transitions.job_state_changed`` after the
transition committed: it writes one Delivery per recipient and channel that wants the change
and hands each to the control worker (``portal.notify.tasks.deliver``) after its own commit.
Nothing here waits on a mail server or a webhook, and nothing here can undo a transition.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from portal.compiled_queries import compiled_rows
from portal.jobs.models import NOTIFY_EVENTS, Job, JobState
from portal.jobs.transitions import StateChange
from portal.notify.models import Delivery, NotificationSettings, TeamWebhook
from portal.notify.signing import new_secret
from portal.notify.targets import url_problem
from portal.notify.tasks import deliver
from portal.tenants.models import Team
from portal.tenants.selectors import can_admin_team

log = logging.getLogger("portal.notify")
S = JobState

# The events each state is, most specific first: a delivery names the first one its
# recipient asked for (a failure is "fail" to who wants failures, "end" to who wants ends).
STATE_EVENTS: dict[str, tuple[str, ...]] = {
    S.RUNNING: ("start",),
    S.PREEMPTED: ("preempt",),
    S.FAILED: ("fail", "end"),
    S.TIMED_OUT: ("fail", "end"),
    S.SUCCEEDED: ("end",),
    S.CANCELLED: ("end",),
}
EVENTS_HELP = f"a list of {', '.join(NOTIFY_EVENTS)} (or [] for none)"
# A delivery whose message was lost is sent again once it is this late.
OVERDUE_AFTER = timedelta(seconds=60)


class NotifyError(ValueError):
    """Settings with problems; ``errors`` maps each field to what it accepts."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{name}: {message}" for name, message in errors.items()))
        self.errors = errors


def event_for(to_state: str, wanted: Iterable[str]) -> str | None:
    """The event a change to ``to_state`` is for someone who wants ``wanted``, or None."""
    chosen = set(wanted)
    return next((event for event in STATE_EVENTS.get(to_state, ()) if event in chosen), None)


# --- deliveries ---------------------------------------------------------------------------


def notify_state_changes(*, changes: Sequence[StateChange], **_: Any) -> list[int]:
    """The receiver of ``job_state_changed``: plan the deliveries, send them after commit."""
    notable = [change for change in changes if change.to_state in STATE_EVENTS]
    if not notable:
        return []
    created = plan_deliveries(notable)
    if created:
        # Called after the transition committed, so this runs at once unless a caller wraps
        # the whole in a transaction of its own; then only after that commits.
        transaction.on_commit(lambda: enqueue(created), robust=True)
    return created


def plan_deliveries(changes: Sequence[StateChange]) -> list[int]:
    """Write the deliveries ``changes`` make (once each, however often a change is told);
    return the new ones' ids. One query reads who wants what, whatever the number of changes;
    then one insert per delivery."""
    candidates = _jobs_with_preferences(sorted({change.job_id for change in changes}))
    if not candidates:
        return []
    jobs = {
        job.pk: job
        for job in Job.objects.filter(pk__in=candidates).select_related(
            "team__webhook", "user__notification_settings"
        )
    }
    now = timezone.now()
    planned: list[Delivery] = []
    for change in changes:
        job = jobs.get(change.job_id)
        if job is None:
            continue
        own = _settings_of(job.user)
        # The job's own list, when its request had one, replaces the owner's usual events.
        event = event_for(change.to_state, job.notify if job.notify is not None else own.events)
        to_owner = {"recipient": f"user:{job.user_id}", "user_id": job.user_id}
        if event is not None and own.email and job.user.email:
            planned.append(
                _delivery(job, change, event, Delivery.Channel.EMAIL, job.user.email, now, to_owner)
            )
        if event is not None and own.webhook_url:
            planned.append(
                _delivery(
                    job, change, event, Delivery.Channel.WEBHOOK, own.webhook_url, now, to_owner
                )
            )
        hook = _webhook_of(job.team)
        team_event = event_for(change.to_state, hook.events) if hook is not None else None
        if hook is not None and team_event is not None:
            to_team = {"recipient": f"team:{job.team_id}", "team_id": job.team_id}
            planned.append(
                _delivery(job, change, team_event, Delivery.Channel.WEBHOOK, hook.url, now, to_team)
            )
    created = []
    if not planned:
        return created
    with transaction.atomic():
        for delivery in planned:
            try:
                with transaction.atomic():
                    delivery.save(force_insert=True)
            except IntegrityError:
                continue  # this change was told before: its delivery exists
            created.append(delivery.pk)
    return created


def _jobs_with_preferences(job_ids: Sequence[int]) -> list[int]:
    """Those of ``job_ids`` that could make a delivery at all: the job has its own list of
    events, its owner has notification settings, or its team a webhook. Without any of them
    nobody asked for anything (``NotificationSettings``' events are none by default).

    Every job a node starts passes through here; most have none of them, and this query
    (SQL compiled once per number of jobs: ``portal.compiled_queries``) spares them reading
    the jobs, their teams, owners and settings as model instances."""
    rows = compiled_rows(
        key=("notify-candidates", len(job_ids)),
        build=lambda ids: Job.objects.filter(
            Q(notify__isnull=False)
            | Q(user__notification_settings__isnull=False)
            | Q(team__webhook__isnull=False),
            pk__in=ids,
        ).values("id"),
        values=job_ids,
    )
    return [row["id"] for row in rows]


def _webhook_of(team: Team) -> TeamWebhook | None:
    try:
        return team.webhook
    except TeamWebhook.DoesNotExist:
        return None


def _settings_of(user: Any) -> NotificationSettings:
    try:
        return user.notification_settings
    except NotificationSettings.DoesNotExist:
        return NotificationSettings(user=user)


def _delivery(
    job: Job,
    change: StateChange,
    event: str,
    channel: str,
    target: str,
    now: datetime,
    recipient: Mapping[str, Any],
) -> Delivery:
    return Delivery(
        **recipient,
        job=job,
        job_attempt=change.attempt,
        to_state=change.to_state,
        event=event,
        channel=channel,
        target=target,
        payload=payload_of(job, change, event),
        created_at=now,
        next_attempt_at=now,
    )


def payload_of(job: Job, change: StateChange, event: str) -> dict[str, Any]:
    """The webhook's JSON body (``delivery`` is added when sent), and what an e-mail says."""
    base = settings.PUBLIC_URL
    return {
        "event": event,
        "at": change.at.isoformat(),
        "message": change.message,
        "job": {
            "id": job.pk,
            "name": job.name,
            "team": job.team.name,
            "user": job.user.get_username(),
            "state": change.to_state,
            "previous_state": change.from_state,
            "attempt": change.attempt,
            "exit_code": job.exit_code,
            "reason": job.reason,
            "url": f"{base}/jobs/{job.pk}/",
            "api_url": f"{base}/api/v1/jobs/{job.pk}/",
        },
    }


def enqueue(delivery_ids: Iterable[int], *, attempts: int = 0) -> int:
    """Hand deliveries to the control worker; returns how many were sent. A broker that is
    away costs nothing but time: the sweep (beat) sends them again once they are overdue."""
    sent = 0
    for delivery_id in delivery_ids:
        try:
            deliver.apply_async(args=[delivery_id, attempts], queue="control")
        except Exception as error:  # noqa: BLE001 - any broker failure is the same to us
            log.warning("could not queue delivery %s (the sweep will): %s", delivery_id, error)
        else:
            sent += 1
    return sent


def resend_overdue(*, now: datetime | None = None, limit: int = 500) -> int:
    """Send again the pending deliveries whose message was lost (overdue by OVERDUE_AFTER)."""
    now = now or timezone.now()
    overdue = Delivery.objects.filter(
        status=Delivery.Status.PENDING, next_attempt_at__lt=now - OVERDUE_AFTER
    ).values_list("pk", "attempts")[:limit]
    sent = 0
    for delivery_id, attempts in overdue:
        sent += enqueue([delivery_id], attempts=attempts)
    return sent


# --- settings -----------------------------------------------------------------------------

_UNSET: Any = object()


@dataclass(frozen=True)
class Saved:
    """Saved settings, and the new webhook secret when one was made (shown this once)."""

    settings: Any
    secret: str | None = None


def notification_settings_get(*, user: Any) -> NotificationSettings:
    """The user's settings (unsaved defaults when they never saved any)."""
    return NotificationSettings.objects.filter(user=user).first() or NotificationSettings(user=user)


def notification_settings_update(
    *,
    user: Any,
    events: Any = _UNSET,
    email: Any = _UNSET,
    webhook_url: Any = _UNSET,
    rotate_secret: Any = False,
) -> Saved:
    """Change what ``user`` is told about and how; fields left out keep their values. A
    webhook gets a new secret when it is first set or when ``rotate_secret``; an empty URL
    removes the webhook and its secret. Raises ``NotifyError`` with every problem at once."""
    errors: dict[str, str] = {}
    current = notification_settings_get(user=user)
    new_events = current.events if events is _UNSET else _events(events, "events", errors)
    new_email = current.email if email is _UNSET else _flag(email, "email", errors)
    url = current.webhook_url if webhook_url is _UNSET else _url(webhook_url, errors)
    rotate = _flag(rotate_secret, "rotate_secret", errors)
    if rotate and not url:
        errors["rotate_secret"] = "there is no webhook to rotate the secret of; set webhook_url"
    if errors:
        raise NotifyError(errors)
    secret = None
    if url and (rotate or not current.webhook_secret):
        secret = new_secret()
    with transaction.atomic():
        saved, _ = NotificationSettings.objects.select_for_update().get_or_create(user=user)
        saved.events = new_events
        saved.email = new_email
        saved.webhook_url = url
        saved.webhook_secret = secret or (saved.webhook_secret if url else "")
        saved.save()
    return Saved(settings=saved, secret=secret)


def team_webhook_get(*, team: Team) -> TeamWebhook | None:
    return TeamWebhook.objects.filter(team=team).first()


def team_webhook_update(
    *,
    team: Team,
    by: Any,
    url: Any = _UNSET,
    events: Any = _UNSET,
    rotate_secret: Any = False,
) -> Saved:
    """Set (or with an empty URL remove) ``team``'s webhook; its admins and site admins only.
    Returns the webhook (None once removed) and its new secret when one was made."""
    if not can_admin_team(user=by, team=team):
        raise PermissionDenied(
            f"only an admin of team {team.name} or a site admin may change its webhook"
        )
    errors: dict[str, str] = {}
    current = team_webhook_get(team=team)
    new_url = (current.url if current else "") if url is _UNSET else _url(url, errors, "url")
    default_events = current.events if current else ["end", "fail"]
    new_events = default_events if events is _UNSET else _events(events, "events", errors)
    rotate = _flag(rotate_secret, "rotate_secret", errors)
    if not new_url and current is None and "url" not in errors:
        errors["url"] = f"required to set a team webhook; allowed: {_URL_ALLOWED}"
    if errors:
        raise NotifyError(errors)
    if not new_url:
        TeamWebhook.objects.filter(team=team).delete()
        return Saved(settings=None)
    secret = new_secret() if rotate or current is None else None
    with transaction.atomic():
        hook, _ = TeamWebhook.objects.select_for_update().get_or_create(
            team=team, defaults={"url": new_url, "secret": secret or new_secret()}
        )
        hook.url = new_url
        hook.events = new_events
        if secret:
            hook.secret = secret
        hook.save()
    return Saved(settings=hook, secret=secret)


# --- checks -------------------------------------------------------------------------------

_URL_ALLOWED = 'an http:// or https:// URL, or "" for none'


def _events(value: Any, name: str, errors: dict[str, str]) -> list[str]:
    if not isinstance(value, list | tuple):
        errors[name] = f"must be a list; allowed: {EVENTS_HELP}"
        return []
    unknown = [repr(item) for item in value if item not in NOTIFY_EVENTS]
    if unknown:
        errors[name] = f"unknown event {', '.join(unknown)}; allowed: {EVENTS_HELP}"
        return []
    return [event for event in NOTIFY_EVENTS if event in value]


def _flag(value: Any, name: str, errors: dict[str, str]) -> bool:
    if isinstance(value, bool):
        return value
    errors[name] = f"{value!r} is not a boolean; allowed: true, false"
    return False


def _url(value: Any, errors: dict[str, str], name: str = "webhook_url") -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        errors[name] = f"must be text; allowed: {_URL_ALLOWED}"
        return ""
    url = value.strip()
    if not url:
        return ""
    problem = url_problem(url)
    if problem is not None:
        errors[name] = problem
    return url
