"""The deployment-wide tombstone retention preference (MAINT-PREF-1).

Maintenance owns this row (``maintenance_preferences``, key ``retention_days``); the
automatic purge cutoff is ``now - retention`` compared with each tombstone's
``deleted_at``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import insert, select, update

from domainerrors import Internal, InvalidArgument
from store.database import Database
from store.models import MaintenancePreference
from store.transactions import write_connection

RETENTION_CHOICES_DAYS = (15, 30)
DEFAULT_RETENTION_DAYS = 30
_KEY = "retention_days"
_DAY_MS = 24 * 60 * 60 * 1000


@dataclass(frozen=True)
class RetentionPreference:
    """The effective preference.

    Attributes:
        days: 15 or 30.
        is_default: No preference was ever stored; the default applies.
        updated_at_unix_ms: When it was last changed (``None`` when default).
    """

    days: int
    is_default: bool
    updated_at_unix_ms: int | None

    def cutoff_unix_ms(self, now_unix_ms: int) -> int:
        """Tombstones deleted before this instant are eligible for purge."""
        return now_unix_ms - self.days * _DAY_MS


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class RetentionPreferences:
    """Reads and writes the preference row."""

    def __init__(self, database: Database, clock: Callable[[], int] = _now_ms) -> None:
        self._database = database
        self._clock = clock

    async def get(self) -> RetentionPreference:
        """Return the stored preference, or the 30-day default."""
        async with self._database.engine.connect() as connection:
            row = (
                await connection.execute(
                    select(
                        MaintenancePreference.value, MaintenancePreference.updated_at_unix_ms
                    ).where(MaintenancePreference.key == _KEY)
                )
            ).first()
        if row is None:
            return RetentionPreference(DEFAULT_RETENTION_DAYS, True, None)
        days = int(row.value)
        if days not in RETENTION_CHOICES_DAYS:
            raise Internal(f"stored retention_days {row.value!r} is not 15 or 30")
        return RetentionPreference(days, False, row.updated_at_unix_ms)

    async def set(self, days: int) -> RetentionPreference:
        """Persist ``days``; setting the current stored value changes nothing.

        Raises:
            InvalidArgument: ``days`` is not 15 or 30 (field ``retention``).
        """
        if days not in RETENTION_CHOICES_DAYS:
            raise InvalidArgument.for_field("retention", "must be 15 or 30 days")
        async with write_connection(self._database.engine) as connection:
            stored = (
                await connection.execute(
                    select(MaintenancePreference).where(MaintenancePreference.key == _KEY)
                )
            ).first()
            now = self._clock()
            if stored is None:
                await connection.execute(
                    insert(MaintenancePreference).values(
                        key=_KEY, value=str(days), updated_at_unix_ms=now
                    )
                )
            elif int(stored.value) != days:
                await connection.execute(
                    update(MaintenancePreference)
                    .where(MaintenancePreference.key == _KEY)
                    .values(value=str(days), updated_at_unix_ms=now)
                )
        return await self.get()
