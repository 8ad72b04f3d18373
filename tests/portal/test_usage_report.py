"""A team's usage over time (portal.jobs.usage): hours per day and member, split at midnight,
running jobs counted up to now, the budget period as the budget counts it, holdings per hour
against the guarantee, and who sees whose hours. Every number is worked out by hand."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import pytest
from usage_world import NOW, at, usage_world

from portal.accounting.usage import HeldInBin, held_per_bin, spread_over_bins
from portal.jobs.testing import allocate, make_job, make_user
from portal.jobs.usage import team_usage_report
from portal.tenants.models import Membership

H = 3600.0


# --- the arithmetic ----------------------------------------------------------------------


def test_a_hold_across_midnight_is_split_into_the_days_it_covers():
    day = 86_400.0
    assert spread_over_bins(day - 2 * H, day + H, first=0.0, bin_s=day, bins=3) == [
        (0, 2 * H),
        (1, H),
    ]
    # Clipped to the bins: a hold from before the first day and past the last.
    assert spread_over_bins(-5 * H, 4 * day, first=0.0, bin_s=day, bins=2) == [(0, day), (1, day)]
    assert spread_over_bins(3 * day, 4 * day, first=0.0, bin_s=day, bins=2) == []


def test_holdings_per_hour_are_exact_means_peaks_and_borrowed_unit_seconds():
    holds = [
        (1.0, -10 * H, 10 * H),  # held all along
        (1.0, 2 * H, 10 * H),  # from the third hour on
        (0.25, 1.5 * H, 1.75 * H),  # a quarter of an hour in the second hour
    ]

    bins = held_per_bin(holds, first=0.0, until=3.5 * H, bin_s=H, guarantee=1.0)

    assert bins == [
        HeldInBin(mean_units=1.0, peak_units=1.0, borrowed_unit_seconds=0.0),
        HeldInBin(mean_units=1.0625, peak_units=1.25, borrowed_unit_seconds=0.25 * 0.25 * H),
        HeldInBin(mean_units=2.0, peak_units=2.0, borrowed_unit_seconds=H),
        # The hour going on: the mean of its first half hour.
        HeldInBin(mean_units=2.0, peak_units=2.0, borrowed_unit_seconds=0.5 * H),
    ]


# --- a team's report ---------------------------------------------------------------------


@pytest.fixture
def team_world(db, settings) -> dict[str, Any]:
    return usage_world(settings)


def report_for(people: dict[str, Any], viewer: str, **options: Any) -> Any:
    return team_usage_report(
        team=people["vision"],
        viewer=people[viewer],
        now=NOW,
        first_day=date(2024, 5, 8),
        last_day=date(2024, 5, 10),
        **options,
    )


def test_a_team_admin_sees_every_member_by_day_split_at_midnight(team_world):
    report = report_for(team_world, "vera")

    assert report.days == (date(2024, 5, 8), date(2024, 5, 9), date(2024, 5, 10))
    assert report.every_member
    by_name = {m.username: m for m in report.members}
    # alice: 8 May 2 h x 2.0; 9 May 1 h x 2.0 + 1 h x 2.0 (running since 23:00);
    # 10 May 6 h x 2.0 (running, up to now) + 0.25 h x 0.25.
    assert by_name["alice"].hours_by_day == (4.0, 4.0, 12.0625)
    assert by_name["alice"].range_hours == 20.0625
    # vera: 10 May 3 h x 1.0 (running since 03:00).
    assert by_name["vera"].hours_by_day == (0.0, 0.0, 3.0)
    assert (by_name["alice"].role, by_name["vera"].role) == ("member", "admin")
    assert report.team_hours_by_day == (4.0, 4.0, 15.0625)
    assert report.others_hours_by_day == (0.0, 0.0, 0.0)


def test_the_period_counts_what_the_budget_counts(team_world):
    report = report_for(team_world, "vera")

    by_name = {m.username: m for m in report.members}
    # alice: 6.0 finished in May + 14.0 running (7 h x 2.0) + 0.0625.
    assert by_name["alice"].period_hours == 20.0625
    # vera: the hold across 1 May counts wholly (2 h x 1.0) + 3.0 running.
    assert by_name["vera"].period_hours == 5.0
    assert report.period_start == datetime(2024, 5, 1, tzinfo=UTC)
    assert (report.period_hours, report.budget_gpu_hours, report.budget_left_hours) == (
        25.0625,
        100.0,
        74.9375,
    )


def test_holdings_against_the_guarantee_hour_by_hour(team_world):
    report = report_for(team_world, "alice", holdings_from=at(10, 0))

    # Raw units: the H100 (1.0) and vera's A100 (1.0) are held now; guarantee 1.0.
    assert (report.guaranteed_units, report.limit_units) == (1.0, 4.0)
    assert (report.held_units, report.borrowed_units) == (2.0, 1.0)
    assert [h.start for h in report.holdings] == [at(10, hour) for hour in range(6)]
    assert [h.mean_units for h in report.holdings] == [1.0, 1.0625, 1.0, 2.0, 2.0, 2.0]
    assert [h.peak_units for h in report.holdings] == [1.0, 1.25, 1.0, 2.0, 2.0, 2.0]
    assert [h.borrowed_unit_hours for h in report.holdings] == [0.0, 0.0625, 0.0, 1.0, 1.0, 1.0]


def test_a_member_sees_themself_and_the_team_total_but_no_other_name(team_world):
    report = report_for(team_world, "alice")

    assert not report.every_member
    assert [m.username for m in report.members] == ["alice"]
    assert report.members[0].hours_by_day == (4.0, 4.0, 12.0625)
    assert report.team_hours_by_day == (4.0, 4.0, 15.0625)
    assert report.others_hours_by_day == (0.0, 0.0, 3.0)
    assert (report.period_hours, report.others_period_hours) == (25.0625, 5.0)


def test_a_site_admin_sees_every_member_and_someone_who_left_the_team(team_world):
    Membership.objects.filter(user=team_world["vera"]).delete()

    report = report_for(team_world, "admin")

    assert report.every_member
    by_name = {m.username: m for m in report.members}
    assert sorted(by_name) == ["alice", "vera"]
    assert (by_name["vera"].role, by_name["vera"].hours_by_day) == ("", (0.0, 0.0, 3.0))


def test_a_member_with_no_use_sees_zeros_and_the_whole_team_as_others(team_world):
    carol = make_user("carol", team=team_world["vision"])
    team_world["carol"] = carol

    report = report_for(team_world, "carol")

    assert [(m.username, m.hours_by_day, m.period_hours) for m in report.members] == [
        ("carol", (0.0, 0.0, 0.0), 0.0)
    ]
    assert report.others_hours_by_day == report.team_hours_by_day


def test_the_report_costs_five_queries_however_many_jobs(team_world, django_assert_num_queries):
    with django_assert_num_queries(5):
        report_for(team_world, "vera")
    for _ in range(5):
        job = make_job(team=team_world["vision"], user=team_world["alice"], state="SUCCEEDED")
        allocate(job, ["GPU-node-a-3"], released=True)
    with django_assert_num_queries(5):
        report_for(team_world, "vera")


def _job_lines(report: Any) -> list[tuple[str, str, float, bool, datetime]]:
    return [
        (job.username, job.state, job.gpu_unit_hours, job.running, job.last_held_at)
        for job in report.jobs
    ]


def test_each_job_is_listed_with_its_hours_on_the_days_the_latest_first(team_world):
    report = report_for(team_world, "vera")

    # Running ones up to now first (the later job first), then by when their hold ended.
    # vera's April job ended before the report's days and bob's is another team's.
    assert _job_lines(report) == [
        ("vera", "RUNNING", 3.0, True, NOW),  # an A100 since 03:00
        ("alice", "RUNNING", 14.0, True, NOW),  # an H100 (2.0) since 9 May 23:00
        ("alice", "SUCCEEDED", 0.0625, False, at(10, 1.75)),  # an MPS quarter, 15 minutes
        ("alice", "SUCCEEDED", 6.0, False, at(9, 1)),  # an H100 for 3 hours
    ]
    assert report.jobs[0].job_id > report.jobs[1].job_id
    # The same hours as the days: a job's line is its part of them.
    assert sum(job.gpu_unit_hours for job in report.jobs) == report.range_hours


def test_a_member_sees_only_their_own_jobs(team_world):
    report = report_for(team_world, "alice")

    assert [line[0] for line in _job_lines(report)] == ["alice", "alice", "alice"]
    assert report.jobs[0].gpu_unit_hours == 14.0
