"""Shared test settings: where the testbed data is, and hypothesis profiles (CI runs more
examples, deterministically)."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile("soak", max_examples=3000, deadline=None)
settings.register_profile("ci", max_examples=150, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")
