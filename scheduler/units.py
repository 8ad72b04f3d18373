"""GPU units, MIG profiles and usage decay: the arithmetic every part of the portal shares.

One GPU unit is one whole GPU. A MIG instance counts for its compute slices out of the 7 a
full GPU has (``1g.10gb`` = 1/7, ``3g.40gb`` = 3/7, ``7g.80gb`` = 1). An MPS share counts for
its fraction of the GPU. The portal imports these helpers to validate requests and to charge
usage; the scheduling core and the simulator use the same ones, so a unit means the same
everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.model import MIG_COMPUTE_SLICES_PER_GPU, SliceKind


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A MIG instance profile such as ``3g.40gb``."""

    name: str
    compute_slices: int
    memory_gb: int
    media_extensions: bool = False  # the ``+me`` variants that own the media engines

    @property
    def units(self) -> float:
        return self.compute_slices / MIG_COMPUTE_SLICES_PER_GPU


def _profiles(*names: str) -> dict[str, MigProfile]:
    table: dict[str, MigProfile] = {}
    for name in names:
        base, _, extension = name.partition("+")
        compute, _, memory = base.partition("g.")
        table[name] = MigProfile(
            name=name,
            compute_slices=int(compute),
            memory_gb=int(memory.removesuffix("gb")),
            media_extensions=extension == "me",
        )
    return table


# The instance profiles of GPUs with 7 compute slices (NVIDIA's MIG user guide). A30 profiles
# are left out on purpose: an A30 has 4 compute slices, so "/ 7" would misprice them.
MIG_PROFILES: Mapping[str, MigProfile] = {
    # A100 40GB
    **_profiles("1g.5gb", "1g.5gb+me", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    # A100 80GB, H100 80GB, H800 80GB
    **_profiles("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    # H100 NVL 94GB / H100 96GB
    **_profiles("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    **_profiles("1g.24gb+me", "3g.48gb", "4g.48gb", "7g.96gb"),
    # H200 141GB
    **_profiles("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    # B200 180GB
    **_profiles("1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
}


def parse_mig_profile(profile: str) -> MigProfile:
    """The MIG profile named ``profile``; a ``ValueError`` naming the allowed values if unknown."""
    name = profile.strip().lower()
    found = MIG_PROFILES.get(name)
    if found is None:
        allowed = ", ".join(sorted(MIG_PROFILES, key=_profile_sort_key))
        raise ValueError(f"profile: unknown MIG profile {profile!r}; allowed: {allowed}")
    return found


def _profile_sort_key(name: str) -> tuple[int, int, str]:
    profile = MIG_PROFILES[name]
    return (profile.compute_slices, profile.memory_gb, name)


def mig_units(profile: str) -> float:
    """GPU units of one MIG instance of ``profile`` (compute slices / 7)."""
    return parse_mig_profile(profile).units


def mps_units(shares_per_gpu: int) -> float:
    """GPU units of one MPS share of a GPU split into ``shares_per_gpu`` equal shares."""
    if shares_per_gpu < 1:
        raise ValueError(f"shares_per_gpu: must be at least 1, got {shares_per_gpu}")
    return 1.0 / shares_per_gpu


def slice_units(kind: SliceKind, *, profile: str = "", shares_per_gpu: int = 1) -> float:
    """GPU units of one slice of ``kind`` (whole = 1.0, MIG by profile, MPS by share count)."""
    if kind is SliceKind.WHOLE:
        return 1.0
    if kind is SliceKind.MIG:
        return mig_units(profile)
    return mps_units(shares_per_gpu)


def billed_units(units: float, model: str, model_weights: Mapping[str, float]) -> float:
    """``units`` weighted by the billing weight of the GPU ``model`` (missing models weigh 1)."""
    return units * model_weights.get(model, 1.0)


def decay(usage: float, elapsed_s: float, half_life_s: float) -> float:
    """``usage`` after ``elapsed_s`` seconds of exponential decay with ``half_life_s``.

    The shell and the simulator both keep usage as ``U <- decay(U, dt, T_half) + new``, so a
    unit-second used a half-life ago weighs half of one used now. A half-life of 0 or less
    switches decay off.
    """
    if elapsed_s <= 0 or half_life_s <= 0:
        return usage
    return usage * math.pow(0.5, elapsed_s / half_life_s)


def decayed_rate(usage: float, half_life_s: float) -> float:
    """Decayed GPU-unit-seconds as the steady number of GPU units that would produce them.

    Holding ``h`` units for ever accumulates ``h * T_half / ln 2`` decayed unit-seconds, so
    this is the inverse: the "average units held lately". It lets the core add history to
    what a team holds now in one currency.
    """
    if half_life_s <= 0:
        return 0.0
    return usage * math.log(2) / half_life_s
