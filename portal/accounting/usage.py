"""The arithmetic of usage, on epoch seconds: what a hold costs and how a balance decays.

A job is charged for the time its slices are held (from assignment to release), in GPU units
weighted by the GPU model's billing weight. Fair share reads *decayed* usage, kept by the
rule the core and the simulator share (``scheduler.units.decay``): ``U <- decay(U, dt) + new``.
A hold's charge is its unit-seconds, valued at the hold's end; a running job's hold so far is
added to the snapshot's usage, so a burst counts at once, and its final charge is what the
snapshots counted for it while it ran.

Usage over time (the Usage page and ``/api/v1/teams/<name>/usage/``): a charge is spread over
the days it covers (``spread_over_bins``), and what a team held is integrated per hour
(``held_per_bin``).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

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


# --- usage over time: charges spread over days, holdings over hours ---------------------------


def spread_over_bins(
    held_from: float, held_until: float, *, first: float, bin_s: float, bins: int
) -> list[tuple[int, float]]:
    """The seconds of ``[held_from, held_until]`` that fall in each of ``bins`` bins of
    ``bin_s`` seconds from ``first``, as (bin index, seconds); bins it misses are left out.

    A hold across midnight lands in both days, each with the part it spent there.
    """
    end_of_bins = first + bins * bin_s
    start, end = max(held_from, first), min(held_until, end_of_bins)
    if end <= start:
        return []
    spread = []
    index = int((start - first) // bin_s)
    while index < bins:
        bin_start = first + index * bin_s
        if bin_start >= end:
            break
        seconds = min(end, bin_start + bin_s) - max(start, bin_start)
        if seconds > 0:
            spread.append((index, seconds))
        index += 1
    return spread


@dataclass(frozen=True, slots=True)
class HeldInBin:
    """What a team held during one bin: the time-weighted mean and the peak, in GPU units,
    and the unit-seconds it held above its guarantee (borrowed)."""

    mean_units: float
    peak_units: float
    borrowed_unit_seconds: float


def held_per_bin(
    holds: Iterable[tuple[float, float, float]],
    *,
    first: float,
    until: float,
    bin_s: float,
    guarantee: float,
) -> list[HeldInBin]:
    """What ``holds`` — (units, held_from, held_until) — add up to in each bin of ``bin_s``
    seconds from ``first`` up to ``until`` (the last bin may be cut short by ``until``: its
    mean is over the part that has passed).

    Exact, not sampled: the holds make a step function (the level changes only where a hold
    starts or ends), integrated over each bin.
    """
    if until <= first:
        return []
    bins = math.ceil((until - first) / bin_s)
    changes: dict[float, float] = defaultdict(float)
    for units, held_from, held_until in holds:
        start, end = max(held_from, first), min(held_until, until)
        if end > start and units:
            changes[start] += units
            changes[end] -= units
    edges = {first + index * bin_s for index in range(bins)}
    times = sorted(edges | set(changes) | {until})
    held = [0.0] * bins
    peak = [0.0] * bins
    borrowed = [0.0] * bins
    level = 0.0
    for start, end in itertools.pairwise(times):
        level += changes.get(start, 0.0)
        # The sum of many + and - leaves dust like 1e-16 where nothing is held.
        level = round(level, 9)
        index = min(int((start - first) // bin_s), bins - 1)
        span = end - start
        held[index] += level * span
        peak[index] = max(peak[index], level)
        borrowed[index] += max(0.0, level - guarantee) * span
    result = []
    for index in range(bins):
        length = min(first + (index + 1) * bin_s, until) - (first + index * bin_s)
        result.append(
            HeldInBin(
                mean_units=held[index] / length if length > 0 else 0.0,
                peak_units=peak[index],
                borrowed_unit_seconds=borrowed[index],
            )
        )
    return result
