"""The scheduling policy's knobs come from PORTAL_SCHED_* variables, checked at start."""

from __future__ import annotations

import pytest

from portal.env import ConfigError
from portal.policy import scheduler_knobs_from_env
from scheduler.config import Policy, SchedulerConfig

DEFAULTS = SchedulerConfig()


def test_with_nothing_set_the_knobs_are_the_cores_defaults(monkeypatch):
    for name in ("PORTAL_SCHED_POLICY", "PORTAL_SCHED_RECLAIM_MAX_RUN_S", "PORTAL_SCHED_RECLAIM"):
        monkeypatch.delenv(name, raising=False)

    knobs = scheduler_knobs_from_env(usage_half_life_s=3600.0)

    assert knobs["policy"] == Policy.FAIRSHARE
    assert knobs["reclaim"] is DEFAULTS.reclaim
    assert knobs["reclaim_max_run_s"] == DEFAULTS.reclaim_max_run_s
    assert knobs["usage_half_life_s"] == 3600.0


@pytest.mark.parametrize(
    ("raw", "expected"), [("none", None), ("", DEFAULTS.max_wait_s), ("60", 60.0)]
)
def test_the_maximum_wait_takes_seconds_or_none(monkeypatch, raw, expected):
    monkeypatch.setenv("PORTAL_SCHED_MAX_WAIT_S", raw)

    assert scheduler_knobs_from_env(usage_half_life_s=3600.0)["max_wait_s"] == expected


@pytest.mark.parametrize(("raw", "expected"), [("none", None), ("NONE", None), ("7200", 7200.0)])
def test_the_reclaim_bound_takes_seconds_or_none(monkeypatch, raw, expected):
    monkeypatch.setenv("PORTAL_SCHED_RECLAIM_MAX_RUN_S", raw)

    assert scheduler_knobs_from_env(usage_half_life_s=3600.0)["reclaim_max_run_s"] == expected


@pytest.mark.parametrize(
    ("raw", "expected"), [("none", None), ("", DEFAULTS.reclaim_wait_s), ("600", 600.0)]
)
def test_the_reclaim_wait_takes_seconds_or_none(monkeypatch, raw, expected):
    monkeypatch.setenv("PORTAL_SCHED_RECLAIM_WAIT_S", raw)

    assert scheduler_knobs_from_env(usage_half_life_s=3600.0)["reclaim_wait_s"] == expected


@pytest.mark.parametrize(
    ("name", "raw", "named"),
    [
        ("PORTAL_SCHED_POLICY", "lottery", "expected one of fairshare, fifo, fifo_backfill"),
        ("PORTAL_SCHED_RECLAIM_MAX_RUN_S", "soon", "expected a number"),
        ("PORTAL_SCHED_GRACE_PERIOD_S", "-1", "expected a number >= 0.0"),
        ("PORTAL_SCHED_RECLAIM", "maybe", "expected one of 1, 0, true, false"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_and_what_it_accepts(
    monkeypatch, name, raw, named
):
    monkeypatch.setenv(name, raw)

    with pytest.raises(ConfigError) as error:
        scheduler_knobs_from_env(usage_half_life_s=3600.0)

    assert str(error.value).startswith(f"{name}=")
    assert named in str(error.value)
