"""Usage charging: once per attempt, decayed with the half-life, read back by team_usage."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.accounting.models import UsageBalance, UsageRecord
from portal.accounting.services import charge_attempt
from portal.accounting.usage import add_charge, balance_at, hold_charge
from portal.jobs.attempts import attempt_release_and_charge
from portal.jobs.models import JobState
from portal.jobs.selectors import team_usage
from portal.jobs.testing import allocate, make_job, make_node, make_team, make_user

HALF_LIFE = 1000.0


def test_a_hold_costs_its_unit_seconds_and_a_balance_halves_every_half_life():
    assert hold_charge(0.5, 100.0, 300.0) == 100.0
    assert hold_charge(1.0, 300.0, 100.0) == 0.0
    assert balance_at(800.0, 0.0, 2 * HALF_LIFE, HALF_LIFE) == pytest.approx(200.0)
    assert balance_at(800.0, 10.0, 5.0, HALF_LIFE) == 800.0  # a clock going back adds nothing


def test_a_charge_older_than_the_balance_is_decayed_to_the_balance_time():
    in_order = add_charge(100.0, 0.0, 50.0, HALF_LIFE, HALF_LIFE)
    out_of_order = add_charge(50.0, HALF_LIFE, 100.0, 0.0, HALF_LIFE)
    assert in_order == (pytest.approx(100.0), HALF_LIFE)
    assert out_of_order == (pytest.approx(100.0), HALF_LIFE)


@pytest.fixture
def people(db, settings):
    settings.SCHEDULER = {
        **settings.SCHEDULER,
        "usage_half_life_s": HALF_LIFE,
        "model_weights": {"NVIDIA H100": 2.0},
    }
    team = make_team("vision", limit_units=None)
    return team, make_user("alice", team=team)


def test_an_attempt_is_charged_once_to_the_team_and_the_user(people):
    team, alice = people
    job = make_job(team=team, user=alice, state=JobState.SUCCEEDED)
    end = timezone.now()
    start = end - timedelta(seconds=100)

    charges = [
        charge_attempt(
            job_id=job.pk,
            attempt=1,
            team_id=team.pk,
            user_id=alice.pk,
            units=2.0,
            held_from=start,
            held_until=end,
            half_life_s=HALF_LIFE,
        )
        for _ in range(2)
    ]

    assert charges == [True, False]
    (record,) = UsageRecord.objects.all()
    assert (record.gpu_units, record.unit_seconds) == (2.0, pytest.approx(200.0))
    balances = UsageBalance.objects.order_by("user_id").values_list("user_id", "unit_seconds")
    assert sorted(balances, key=str) == sorted(
        [(None, pytest.approx(200.0)), (alice.pk, pytest.approx(200.0))], key=str
    )


def test_later_charges_add_to_the_decayed_balance(people):
    team, alice = people
    t0 = timezone.now() - timedelta(seconds=2 * HALF_LIFE)
    for attempt, (start, end) in enumerate([(0, 100), (HALF_LIFE, HALF_LIFE + 50)], start=1):
        job = make_job(team=team, user=alice, state=JobState.SUCCEEDED, name=f"j{attempt}")
        charge_attempt(
            job_id=job.pk,
            attempt=1,
            team_id=team.pk,
            user_id=alice.pk,
            units=1.0,
            held_from=t0 + timedelta(seconds=start),
            held_until=t0 + timedelta(seconds=end),
            half_life_s=HALF_LIFE,
        )

    balance = UsageBalance.objects.get(team=team, user__isnull=True)
    # 100 charged at t0+100, decayed over 950 s, plus 50 charged at t0+1050.
    assert balance.unit_seconds == pytest.approx(100 * 0.5 ** (950 / HALF_LIFE) + 50)
    assert balance.as_of == t0 + timedelta(seconds=HALF_LIFE + 50)


def test_team_usage_counts_balances_running_jobs_and_units_held_now(people):
    team, alice = people
    make_node(
        "node-a", gpus=[{"mode": "whole", "model": "NVIDIA H100"}, {"mode": "mps", "shares": 4}]
    )
    now = timezone.now()
    UsageBalance.objects.create(
        team=team, unit_seconds=400.0, as_of=now - timedelta(seconds=HALF_LIFE)
    )
    running = make_job(team=team, user=alice, state=JobState.RUNNING)
    allocate(running, ["GPU-node-a-0", "GPU-node-a-1/mps/0"])
    running.allocations.update(created_at=now - timedelta(seconds=10))

    usage = team_usage(team=team, now=now)

    assert usage["units_in_use"] == pytest.approx(1.25)
    # 400 decayed one half-life = 200; the H100 unit bills 2.0: (2.0 + 0.25) x 10 s.
    assert usage["decayed_unit_seconds"] == pytest.approx(200.0 + 22.5)
    if now.day > 1 or now.hour > 0:
        assert usage["gpu_hours_this_month"] == pytest.approx(22.5 / 3600)
    assert usage["budget_gpu_hours"] is None

    attempt_release_and_charge(job_id=running.pk, attempt=1, ended_at=now, now=now)
    after = team_usage(team=team, now=now)
    assert after["units_in_use"] == 0.0
    assert after["decayed_unit_seconds"] == pytest.approx(usage["decayed_unit_seconds"])
