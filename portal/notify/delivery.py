"""One try of one delivery: claim it, send it (e-mail or webhook), record what happened.

A try is claimed by a conditional UPDATE on the delivery's try count (``attempts``), so two
messages about the same try (a redelivered message, the sweep's resend) never both send.
Failures that a retry may cure (a receiver that is down, a 500, an SMTP hiccup) are retried
with doubling waits until PORTAL_NOTIFY_MAX_ATTEMPTS tries were made; the others (a target
the allow-list refuses, a 4xx answer, a webhook changed since) fail at once.
"""

from __future__ import annotations

import http.client
import json
import smtplib
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db.models import F
from django.utils import timezone

from portal.notify.models import Delivery, NotificationSettings, TeamWebhook
from portal.notify.signing import SIGNATURE_HEADER, signature
from portal.notify.targets import TargetRefused, post

# Answers worth another try: the receiver is busy, down or asks us to come back.
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
MAX_WAIT_S = 3600.0
USER_AGENT = "gpu-portal-webhook/1"


class Undeliverable(Exception):
    """A failure no retry can cure."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one try did: ``status`` (delivered, retry, failed, skipped: the try was not
    ours to make) and, for a retry, after how long and at which try count."""

    status: str
    attempts: int = 0
    retry_in: float | None = None


def retry_wait(attempts: int) -> float:
    """Seconds before the next try after ``attempts`` tries: PORTAL_NOTIFY_RETRY_S, doubled
    each time, at most an hour."""
    return min(settings.NOTIFY_RETRY_S * 2 ** max(attempts - 1, 0), MAX_WAIT_S)


def attempt_delivery(delivery_id: int, *, attempts: int, now: datetime | None = None) -> Outcome:
    """Make try ``attempts + 1`` of a pending delivery, unless another message made it."""
    now = now or timezone.now()
    # While a try runs, the sweep leaves it alone; after this, it counts as lost.
    lease = now + timedelta(seconds=settings.WEBHOOK_TIMEOUT_S + settings.EMAIL_TIMEOUT + 60)
    claimed = Delivery.objects.filter(
        pk=delivery_id, status=Delivery.Status.PENDING, attempts=attempts
    ).update(attempts=F("attempts") + 1, next_attempt_at=lease)
    if not claimed:
        return Outcome("skipped")
    delivery = Delivery.objects.get(pk=delivery_id)  # the payload holds what a try sends
    try:
        if delivery.channel == Delivery.Channel.EMAIL:
            send_email(delivery)
        else:
            send_webhook(delivery)
    except (TargetRefused, Undeliverable) as error:
        return _settle(delivery, Delivery.Status.FAILED, str(error))
    except (OSError, http.client.HTTPException, smtplib.SMTPException) as error:
        detail = f"{type(error).__name__}: {error}"
        if delivery.attempts >= settings.NOTIFY_MAX_ATTEMPTS:
            return _settle(delivery, Delivery.Status.FAILED, detail)
        return _later(delivery, detail)
    # A delivery that needed more than one try keeps the error of the last failed one.
    return _settle(delivery, Delivery.Status.DELIVERED, delivery.last_error)


class RetryableAnswer(OSError):
    """A webhook answer worth another try (a 5xx, 429, ...)."""


def send_webhook(delivery: Delivery) -> None:
    """POST the signed payload to the webhook as it is now (the same URL, its secret)."""
    secret = _current_secret(delivery)
    body = json.dumps({"delivery": delivery.pk, **delivery.payload}, sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Portal-Event": delivery.event,
        "X-Portal-Delivery": str(delivery.pk),
        SIGNATURE_HEADER: signature(secret, body, int(time.time())),
    }
    status, reply = post(
        delivery.target, body=body, headers=headers, timeout=settings.WEBHOOK_TIMEOUT_S
    )
    if 200 <= status < 300:
        return
    answer = f"the receiver answered {status}" + (f": {reply.strip()[:200]}" if reply else "")
    if status in RETRY_STATUSES:
        raise RetryableAnswer(answer)
    if 300 <= status < 400:
        raise Undeliverable(f"{answer} (redirects are not followed; set the final URL)")
    raise Undeliverable(answer)


def _current_secret(delivery: Delivery) -> str:
    if delivery.team_id is not None:
        hook = TeamWebhook.objects.filter(team_id=delivery.team_id).first()
        url, secret = (hook.url, hook.secret) if hook else ("", "")
    else:
        own = NotificationSettings.objects.filter(user_id=delivery.user_id).first()
        url, secret = (own.webhook_url, own.webhook_secret) if own else ("", "")
    if url != delivery.target or not secret:
        raise Undeliverable("the webhook was changed or removed after this event")
    return secret


def send_email(delivery: Delivery) -> None:
    subject, body = email_text(delivery.payload)
    EmailMessage(subject=subject, body=body, to=[delivery.target]).send(fail_silently=False)


def email_text(payload: dict[str, Any]) -> tuple[str, str]:
    """An e-mail's subject and body for a delivery's payload."""
    job = payload["job"]
    subject = f"[GPU portal] job {job['id']} {job['name']!r}: {job['state']}"
    lines = [
        f"Job {job['id']} ({job['name']}) of team {job['team']} is {job['state']} "
        f"(was {job['previous_state'] or 'new'}), attempt {job['attempt']}.",
        "",
        f"What happened: {payload['message'] or job['state']}",
    ]
    if job.get("exit_code") is not None:
        lines.append(f"Exit code: {job['exit_code']}")
    if job.get("reason"):
        lines.append(f"Reason: {job['reason']}")
    lines += [
        f"When: {payload['at']}",
        "",
        f"The job: {job['url']}",
        f"Its log: {job['api_url']}log/",
        "",
        f"You get this for the {payload['event']!r} event: change what you are told on "
        "the portal's Notifications page (/settings/notifications/).",
    ]
    return subject, "\n".join(lines) + "\n"


def _settle(delivery: Delivery, status: str, error: str) -> Outcome:
    Delivery.objects.filter(
        pk=delivery.pk, status=Delivery.Status.PENDING, attempts=delivery.attempts
    ).update(status=status, last_error=error, finished_at=timezone.now(), next_attempt_at=None)
    return Outcome(status, attempts=delivery.attempts)


def _later(delivery: Delivery, error: str) -> Outcome:
    wait = retry_wait(delivery.attempts)
    Delivery.objects.filter(
        pk=delivery.pk, status=Delivery.Status.PENDING, attempts=delivery.attempts
    ).update(last_error=error, next_attempt_at=timezone.now() + timedelta(seconds=wait))
    return Outcome("retry", attempts=delivery.attempts, retry_in=wait)
