"""Hypothesis profiles: a modest ``ci`` budget by default, ``soak`` for long local runs.

Select with ``TUTTI_HYPOTHESIS_PROFILE=soak`` (or ``ci``, ``dev``). No example database
is written (runs use ``-p no:cacheprovider`` and must leave the tree clean), and there is
no per-example deadline: the suite's 120 s per-test timeout bounds slow machines instead.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=200, deadline=None, database=None)
settings.register_profile(
    "soak",
    max_examples=5000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("TUTTI_HYPOTHESIS_PROFILE", "ci"))
