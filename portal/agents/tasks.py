"""The control plane's tasks about agents (queue ``control``): their reports, and the reaper
that beat runs every PORTAL_REAP_INTERVAL_S."""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, transaction
from django.utils import timezone

from portal.agents.dispatch import send_ack
from portal.agents.gpu_metrics import rollup_gpu_samples
from portal.agents.idle import check_idle_jobs
from portal.agents.recovery import reap_lost_agents as reap
from portal.agents.reports import AgentRefused, handle_report
from portal.agents.trust import claim_nonce, open_report, record_refusal
from portal.celery import app
from workers.protocol import TASK_AGENT_REPORT
from workers.signing import SignatureError

log = logging.getLogger("portal.agents")


@app.task(
    name=TASK_AGENT_REPORT,
    ignore_result=True,
    # A database hiccup is worth a few retries; every handler is idempotent, and the nonce
    # is claimed in the same transaction, so a retried message is not taken for a replay.
    autoretry_for=(DatabaseError,),
    max_retries=5,
    retry_backoff=True,
    retry_backoff_max=30,
)
def agent_report(envelope: Any) -> str:
    """Verify and apply one signed message from an agent, then acknowledge it.

    A message that fails verification (signature, node, freshness, replay, shape) is refused
    and recorded; retrying cannot make it valid. The acknowledgement goes out only after the
    transaction committed: an agent forgets a report only once the portal really has it.
    """
    now = timezone.now()
    try:
        received = open_report(envelope, now=now)
        with transaction.atomic():
            claim_nonce(received.envelope, now=now)
            ack = handle_report(received.message, now=now)
            if ack is not None:
                transaction.on_commit(lambda: send_ack(ack, key=received.key))
    except SignatureError as error:
        record_refusal(error, envelope, now=now)
        return f"refused: {error.reason}"
    except AgentRefused as error:
        record_refusal(
            SignatureError(error.reason, error.detail, node=received.envelope.node),
            envelope,
            now=now,
        )
        return f"refused: {error.reason}"
    return received.message.TYPE


@app.task(name="portal.reap_lost_agents", ignore_result=True)
def reap_lost_agents() -> dict[str, int]:
    """Mark agents without a heartbeat lost, requeue their jobs, re-send lost messages."""
    return reap().as_dict()


@app.task(name="portal.gpu_samples_rollup", ignore_result=True)
def gpu_samples_rollup() -> dict[str, int]:
    """GPU samples older than the raw window become means; the oldest are pruned."""
    return rollup_gpu_samples(now=timezone.now()).as_dict()


@app.task(name="portal.idle_check", ignore_result=True)
def idle_check() -> dict[str, int]:
    """Warn running jobs whose GPUs stay idle; stop those the team's settings say to."""
    return check_idle_jobs(now=timezone.now()).as_dict()
