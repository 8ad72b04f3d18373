"""The scheduling policy's knobs: read from the environment at start, built per pass.

``scheduler_knobs_from_env()`` runs inside ``portal/settings.py`` (before Django is set up), so
this module imports nothing from Django apps at load time: only the pure core's
``SchedulerConfig`` (whose defaults are the single source of the default values) and the env
helpers. It lives outside the apps because the scheduling pass is not its only reader: ending
an attempt (``portal.jobs``) bills by its model weights and half-life, and a preemption's stop
(``portal.agents``) carries its grace period.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from portal.env import ConfigError, env_bool, env_float, env_int, env_str
from scheduler.config import Policy, SchedulerConfig

_DEFAULTS = SchedulerConfig()


def parse_model_weights(name: str, raw: str) -> dict[str, float]:
    """``"NVIDIA H100 80GB HBM3=2, Tesla T4=0.5"`` -> {model: billing weight of one GPU unit}."""
    weights: dict[str, float] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        model, sep, value = item.rpartition("=")
        model = model.strip()
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not sep or not model or weight <= 0:
            raise ConfigError(
                f"{name}={raw!r}: each item must be <GPU model>=<weight > 0>, e.g. 'Tesla T4=0.5'"
            )
        weights[model] = weight
    return weights


def _optional_seconds(name: str, default: float | None) -> float | None:
    """A number of seconds >= 0, or ``none`` for no bound; unset means ``default``."""
    raw = os.environ.get(name, "").strip().lower()
    if raw == "none":
        return None
    if not raw:
        return default
    return env_float(name, 0.0, minimum=0.0)


def scheduler_knobs_from_env(*, usage_half_life_s: float) -> dict[str, Any]:
    """The ``SchedulerConfig`` keyword arguments the operator set, validated now.

    Raises ``ConfigError`` naming the variable for a value the core would refuse.
    """
    policies = ", ".join(p.value for p in Policy)
    policy = env_str("PORTAL_SCHED_POLICY", _DEFAULTS.policy.value).strip().lower()
    if policy not in {p.value for p in Policy}:
        raise ConfigError(f"PORTAL_SCHED_POLICY={policy!r}: expected one of {policies}")
    knobs: dict[str, Any] = {
        "policy": Policy(policy),
        "usage_half_life_s": usage_half_life_s,
        "backfill": env_bool("PORTAL_SCHED_BACKFILL", _DEFAULTS.backfill),
        "reclaim": env_bool("PORTAL_SCHED_RECLAIM", _DEFAULTS.reclaim),
        "preempt_by_priority": env_bool(
            "PORTAL_SCHED_PREEMPT_BY_PRIORITY", _DEFAULTS.preempt_by_priority
        ),
        "min_run_time_s": env_float(
            "PORTAL_SCHED_MIN_RUN_TIME_S", _DEFAULTS.min_run_time_s, minimum=0.0
        ),
        "grace_period_s": env_float(
            "PORTAL_SCHED_GRACE_PERIOD_S", _DEFAULTS.grace_period_s, minimum=0.0
        ),
        "aging_per_hour": env_float(
            "PORTAL_SCHED_AGING_PER_HOUR", _DEFAULTS.aging_per_hour, minimum=0.0
        ),
        "history_weight": env_float(
            "PORTAL_SCHED_HISTORY_WEIGHT", _DEFAULTS.history_weight, minimum=0.0
        ),
        "max_reservations": env_int(
            "PORTAL_SCHED_MAX_RESERVATIONS", _DEFAULTS.max_reservations, minimum=0
        ),
        "reclaim_max_run_s": _optional_seconds(
            "PORTAL_SCHED_RECLAIM_MAX_RUN_S", _DEFAULTS.reclaim_max_run_s
        ),
        "reclaim_wait_s": _optional_seconds(
            "PORTAL_SCHED_RECLAIM_WAIT_S", _DEFAULTS.reclaim_wait_s
        ),
        "max_wait_s": _optional_seconds("PORTAL_SCHED_MAX_WAIT_S", _DEFAULTS.max_wait_s),
        "model_weights": parse_model_weights(
            "PORTAL_SCHED_MODEL_WEIGHTS", env_str("PORTAL_SCHED_MODEL_WEIGHTS", "")
        ),
    }
    try:
        SchedulerConfig(**knobs)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return knobs


def build_scheduler_config(
    knobs: Mapping[str, Any], *, priority_classes: tuple[str, ...]
) -> SchedulerConfig:
    return SchedulerConfig(**{**knobs, "priority_classes": priority_classes})


def scheduler_config() -> SchedulerConfig:
    """The config of this pass, from ``settings.SCHEDULER`` (tests may override it)."""
    from django.conf import settings

    # At call time: this module is loaded by the settings, before any app's models.
    from portal.tenants.models import PRIORITY_CLASSES

    return build_scheduler_config(settings.SCHEDULER, priority_classes=PRIORITY_CLASSES)
