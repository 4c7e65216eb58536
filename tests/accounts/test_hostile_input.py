"""Hostile identifiers and bodies: always a clear 4xx, never a 500, nothing stored."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from accounts.models import User
from stacks.models import Stack
from tests.factories import bearer_client, make_key, make_org

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("method", "path"), [
    ("get", "/api/v1/stacks/a%00b/"),
    ("patch", "/api/v1/stacks/a%00b/"),
    ("post", "/api/v1/stacks/a%00b/archive"),
    ("get", "/api/v1/stacks/a%00b/teachers/"),
    ("delete", "/api/v1/stacks/s%00/teachers/u%00/"),
    ("get", "/api/v1/stacks/" + "x" * 300 + "/"),
    ("get", "/api/v1/keys/k%00/"),
    ("delete", "/api/v1/keys/" + "k" * 300 + "/"),
    ("delete", "/auth/keys/k%00"),
    ("post", "/auth/keys/k%00/cycle"),
    ("delete", "/api/v1/members/u%00/"),
])
def test_nul_bytes_and_overlong_ids_in_paths_are_404(method: str, path: str) -> None:
    _, secret = make_key(make_org())
    response = getattr(bearer_client(secret), method)(path, {}, format="json")
    assert response.status_code == 404, response.content
    assert response.json()["error"]["code"]


@pytest.mark.parametrize("body", [
    {"stack_id": "x", "email": "a" * 250 + "@example.test"},
    {"stack_id": "x", "email": "a\x00b@example.test"},
    {"stack_id": "x", "email": "ok@example.test", "display_name": "a\x00"},
    {"stack_id": "x", "display_name": {"nested": True}},
    {"stack_id": "a\x00b"},
])
def test_hostile_register_bodies_are_400_and_store_nothing(body: dict) -> None:
    response = APIClient().post("/auth/register", body, format="json")
    assert response.status_code == 400, response.content
    assert not User.objects.exists() and not Stack.objects.exists()


def test_nul_in_native_bodies_is_400() -> None:
    _, secret = make_key(make_org())
    client = bearer_client(secret)
    assert client.post("/api/v1/stacks/", {"stack_id": "ok", "display_name": "a\x00"}, format="json").status_code == 400
    assert client.post("/api/v1/keys/", {"name": "a\x00"}, format="json").status_code == 400
    assert not Stack.objects.exists()
