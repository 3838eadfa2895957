"""Fixtures for the frontend tests."""

from __future__ import annotations

import pytest

from tests.frontend.helpers import EXAMPLE_NAMES


@pytest.fixture(params=EXAMPLE_NAMES)
def example_name(request: pytest.FixtureRequest) -> str:
    """Each example model file in turn."""
    return request.param
