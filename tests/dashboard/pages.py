"""What the dashboard tests share: a signed-in test client, and the CSRF token a page's form carries."""

from __future__ import annotations

import re
from typing import Any

from django.test import Client


def client_for(user: Any, *, csrf: bool = False) -> Client:
    """A client signed in as `user`; with `csrf=True` it enforces CSRF as a browser's requests meet it."""
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def csrf_token(client: Client, url: str) -> str:
    """The token a browser would send: read from the page's form, as the user agent does."""
    page = client.get(url).content.decode()
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert match, "the page has a CSRF-protected form"
    return match.group(1)
