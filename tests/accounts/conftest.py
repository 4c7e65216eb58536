from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from accounts.throttles import throttle_state_clear


@pytest.fixture(autouse=True)
def reset_throttles() -> Iterator[None]:
    """Every request in these tests comes from 127.0.0.1: start each test with fresh counters."""
    throttle_state_clear()
    yield


@pytest.fixture(autouse=True)
def fast_password_hasher(settings: Any) -> None:
    """Factories create many users; the production hasher would dominate these tests' run time."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
