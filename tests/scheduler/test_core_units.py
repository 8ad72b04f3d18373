"""GPU units, MIG profiles and usage decay."""

from __future__ import annotations

import math

import pytest

from scheduler import SchedulerConfig, SliceKind
from scheduler.units import (
    billed_units,
    decay,
    decayed_rate,
    mig_units,
    mps_units,
    parse_mig_profile,
    slice_units,
)


@pytest.mark.parametrize(
    ("profile", "units"),
    [
        ("1g.10gb", 1 / 7),
        ("1g.5gb", 1 / 7),
        ("1g.20gb", 1 / 7),
        ("2g.20gb", 2 / 7),
        ("3g.40gb", 3 / 7),
        ("4g.40gb", 4 / 7),
        ("7g.80gb", 1.0),
        ("3g.20gb", 3 / 7),
        ("7g.40gb", 1.0),
        ("1g.10gb+me", 1 / 7),
        ("7g.141gb", 1.0),
    ],
)
def test_a_mig_instance_is_worth_its_compute_slices_over_seven(profile: str, units: float) -> None:
    assert mig_units(profile) == pytest.approx(units)


def test_a_profile_is_read_case_and_space_insensitively() -> None:
    parsed = parse_mig_profile(" 3G.40GB ")
    assert (parsed.name, parsed.compute_slices, parsed.memory_gb) == ("3g.40gb", 3, 40)


@pytest.mark.parametrize("bad", ["", "3g", "3g.41gb", "8g.80gb", "2g.12gb"])
def test_an_unknown_profile_is_refused_with_the_allowed_values(bad: str) -> None:
    with pytest.raises(ValueError, match=r"profile: unknown MIG profile .*allowed: 1g\.5gb"):
        parse_mig_profile(bad)


def test_slice_units_by_kind() -> None:
    assert slice_units(SliceKind.WHOLE) == 1.0
    assert slice_units(SliceKind.MIG, profile="2g.20gb") == pytest.approx(2 / 7)
    assert slice_units(SliceKind.MPS, shares_per_gpu=4) == 0.25
    with pytest.raises(ValueError, match="shares_per_gpu"):
        mps_units(0)


def test_billing_weight_per_model() -> None:
    assert billed_units(2.0, "H100", {"H100": 2.5}) == 5.0
    assert billed_units(2.0, "T4", {"H100": 2.5}) == 2.0


def test_usage_halves_every_half_life() -> None:
    assert decay(100.0, 7.0, 7.0) == pytest.approx(50.0)
    assert decay(100.0, 14.0, 7.0) == pytest.approx(25.0)
    assert decay(100.0, 0.0, 7.0) == 100.0
    assert decay(100.0, 5.0, 0.0) == 100.0  # half-life 0: no decay


def test_decay_in_steps_equals_decay_at_once() -> None:
    stepwise = decay(decay(decay(80.0, 1.0, 5.0), 2.5, 5.0), 3.0, 5.0)
    assert stepwise == pytest.approx(decay(80.0, 6.5, 5.0))


def test_decayed_rate_inverts_steady_holding() -> None:
    half_life = 3600.0
    steady = 3.0 * half_life / math.log(2)  # holding 3 units for ever
    assert decayed_rate(steady, half_life) == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("aging_per_hour", -1.0),
        ("usage_half_life_s", -5.0),
        ("priority_classes", ()),
        ("max_reservations", -1),
        ("history_weight", -0.1),
        ("model_weights", {"H100": 0.0}),
        ("caches", frozenset({"memo"})),
    ],
)
def test_a_bad_config_value_is_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"SchedulerConfig.{field}"):
        SchedulerConfig(**{field: value})  # type: ignore[arg-type]
