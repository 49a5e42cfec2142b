"""Shared by the test_bad_input*.py files: the hypothesis settings their property tests run under."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
