"""The GPU portal's control plane (Django)."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
