"""API clients for tests that need the real CSRF check on dashboard sessions."""

from __future__ import annotations

from django.conf import settings
from django.utils.crypto import get_random_string
from rest_framework.test import APIClient

from accounts.models import User


def csrf_session_client(user: User) -> APIClient:
    """A logged-in session client that enforces CSRF and sends a valid token with every request,
    as the dashboard's JavaScript would (cookie + X-CSRFToken header)."""
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    token = get_random_string(32)
    client.cookies[settings.CSRF_COOKIE_NAME] = token
    client.credentials(HTTP_X_CSRFTOKEN=token)
    return client
