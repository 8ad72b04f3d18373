"""Charging usage: one UsageRecord per attempt, and the decayed balances fair share reads."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from django.db import IntegrityError, transaction

from portal.accounting.models import UsageBalance, UsageRecord
from portal.accounting.usage import add_charge, hold_charge

log = logging.getLogger("portal.accounting")


def charge_attempt(
    *,
    job_id: int,
    attempt: int,
    team_id: int,
    user_id: int,
    units: float,
    held_from: datetime,
    held_until: datetime,
    half_life_s: float,
) -> bool:
    """Charge one attempt's hold of ``units`` (billed GPU units) over ``[held_from, held_until]``.

    Idempotent: the first call writes the UsageRecord and adds the decayed charge to the
    team's and the user's balances; a repeat (the agent re-sent ``finished``, or the reaper
    and the report both ended the attempt) finds the record and charges nothing. Returns
    whether it charged.
    """
    held_until = max(held_until, held_from)
    seconds = (held_until - held_from).total_seconds()
    with transaction.atomic():
        try:
            with transaction.atomic():
                UsageRecord.objects.create(
                    job_id=job_id,
                    attempt=attempt,
                    team_id=team_id,
                    user_id=user_id,
                    gpu_units=units,
                    started_at=held_from,
                    ended_at=held_until,
                    unit_seconds=units * seconds,
                )
        except IntegrityError:
            return False
        charge = hold_charge(units, held_from.timestamp(), held_until.timestamp())
        _add_to_balance(team_id, None, charge, held_until, half_life_s)
        _add_to_balance(team_id, user_id, charge, held_until, half_life_s)
    return True


def _add_to_balance(
    team_id: int, user_id: int | None, charge: float, charged_at: datetime, half_life_s: float
) -> None:
    balance = _locked_balance(team_id, user_id, charged_at)
    value, as_of = add_charge(
        balance.unit_seconds,
        balance.as_of.timestamp(),
        charge,
        charged_at.timestamp(),
        half_life_s,
    )
    balance.unit_seconds = value
    balance.as_of = datetime.fromtimestamp(as_of, tz=UTC)
    balance.save(update_fields=["unit_seconds", "as_of"])


def _locked_balance(team_id: int, user_id: int | None, as_of: datetime) -> UsageBalance:
    """The balance row, locked for this transaction; created at zero when missing."""
    rows = UsageBalance.objects.select_for_update().filter(team_id=team_id, user_id=user_id)
    balance = rows.first()
    if balance is not None:
        return balance
    try:
        with transaction.atomic():
            return UsageBalance.objects.create(
                team_id=team_id, user_id=user_id, unit_seconds=0.0, as_of=as_of
            )
    except IntegrityError:
        # Another transaction created it first; its row is committed now.
        return rows.get()
