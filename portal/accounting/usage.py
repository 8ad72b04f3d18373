"""The arithmetic of usage, on epoch seconds: what a hold costs and how a balance decays.

A job is charged for the time its slices are held (from assignment to release), in GPU units
weighted by the GPU model's billing weight. Fair share reads *decayed* usage, kept by the
rule the core and the simulator share (``scheduler.units.decay``): ``U <- decay(U, dt) + new``.
A hold's charge is its unit-seconds, valued at the hold's end; a running job's hold so far is
added to the snapshot's usage, so a burst counts at once, and its final charge is what the
snapshots counted for it while it ran.
"""

from __future__ import annotations

from scheduler.units import decay


def hold_charge(units: float, held_from: float, held_until: float) -> float:
    """Unit-seconds of holding ``units`` over ``[held_from, held_until]``."""
    return max(0.0, units) * max(0.0, held_until - held_from)


def balance_at(unit_seconds: float, as_of: float, now: float, half_life_s: float) -> float:
    """A balance kept as of ``as_of``, decayed to ``now`` (never grown by a clock going back)."""
    return decay(unit_seconds, now - as_of, half_life_s)


def add_charge(
    unit_seconds: float, as_of: float, charge: float, charged_at: float, half_life_s: float
) -> tuple[float, float]:
    """Add ``charge`` (valued at ``charged_at``) to a balance; returns (new balance, new as_of).

    Charges may arrive out of order (two agents report at once); a charge older than the
    balance is decayed to the balance's time instead of moving the balance back.
    """
    if charged_at >= as_of:
        return decay(unit_seconds, charged_at - as_of, half_life_s) + charge, charged_at
    return unit_seconds + decay(charge, as_of - charged_at, half_life_s), as_of
