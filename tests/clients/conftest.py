"""Fixtures for the client libraries' tests (clients/): a live MemoryHub on the test database.

* ``hub_url`` (function): the base URL of pytest-django's ``live_server`` (a server thread of this
  process, so settings a test changes apply to it). Tests using it need
  ``@pytest.mark.django_db(transaction=True)`` so the server thread sees what they write; the
  keys come from the `school` cast (tests/actors.py: an agent key on "alice", a school key).
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def hub_url(live_server: Any) -> str:
    return str(live_server.url).rstrip("/")
