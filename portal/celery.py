"""The control plane's Celery app: the scheduling loop (beat) and the agents' reports."""

from __future__ import annotations

import os
import sys
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
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
