"""The control plane's Celery app: the scheduling loop (beat) and the agents' reports."""

from __future__ import annotations

import os
import sys
import uuid
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun
from celery.utils.nodenames import anon_nodename
from celery.utils.saferepr import saferepr
from kombu.utils.json import dumps

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

# What Celery's protocol 2 puts in a message's body after its arguments, for a task sent
# without callbacks, errbacks, chain or chord.
_NO_WORKFLOW = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


class PortalCelery(Celery):
    """Celery, plus a lean publish for the messages to the agents."""

    def send_to_queue(self, name: str, envelope: Any, *, queue: str, expires_s: float) -> None:
        """Publish task ``name`` with the one argument ``envelope`` (a signed message) onto
        ``queue``, through the direct exchange, as ``send_task(name, args=[envelope],
        queue=queue, expires=expires_s, declare=())`` would: the same Celery protocol 2
        message, headers and properties, byte for byte but for its ids and times (what the
        agent's worker reads is unchanged). Raises what the broker raises, after the
        publish retry policy.

        ``send_task`` routes the task, builds the message through ``amqp.as_task_v2``,
        sends the ``before_task_publish`` and ``after_task_publish`` signals and wraps the
        producer's publish; for a pass's thousands of launches and every report's
        acknowledgement that came to twice the cost of publishing itself (a kept producer
        from the app's pool, the body serialised here once)."""
        task_id = str(uuid.uuid4())
        args = [envelope]
        expires = datetime.now(UTC) + timedelta(seconds=expires_s)
        headers = {
            "lang": "py",
            "task": name,
            "id": task_id,
            "shadow": None,
            "eta": None,
            "expires": expires.isoformat(),
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": saferepr(args, self.amqp.argsrepr_maxsize),
            "kwargsrepr": "{}",
            "origin": anon_nodename(),
            "ignore_result": False,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        }
        body = dumps([args, {}, _NO_WORKFLOW])
        with self.producer_or_acquire() as producer:
            producer.publish(
                body,
                routing_key=queue,
                exchange="",
                declare=[],
                content_type="application/json",
                content_encoding="utf-8",
                headers=headers,
                correlation_id=task_id,
                reply_to=self.thread_oid,
                delivery_mode=2,
                expiration=expires_s,
                priority=0,
                **self._publish_retry,
            )

    @cached_property
    def _publish_retry(self) -> dict[str, Any]:
        # Read once: a lookup in Celery's layered settings costs more than a few microseconds.
        return {
            "retry": self.conf.task_publish_retry,
            "retry_policy": self.conf.task_publish_retry_policy,
        }


app = PortalCelery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["portal.scheduling", "portal.agents", "portal.notify"])

# Celery's Django fixup closes the worker's database connection before and after every task
# unless CELERY_DB_REUSE_MAX is set (celery/fixups/django.py): each agent report batch opened
# a new PostgreSQL connection (a server process forked for it) and paid for it in its first
# query, whatever CONN_MAX_AGE said. So the fixup never closes them, and each task closes them
# as Django does around each request: one that failed or outlived CONN_MAX_AGE is closed, and
# with CONN_HEALTH_CHECKS the task's first query checks the one it reuses (a PostgreSQL restart
# costs a reconnection, not a failed task).
app.conf["CELERY_DB_REUSE_MAX"] = sys.maxsize


@task_prerun.connect
@task_postrun.connect
def _close_old_connections(sender: Any = None, **_: Any) -> None:
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return  # run in the caller's thread, inside the caller's transaction
    from django.db import close_old_connections

    close_old_connections()
