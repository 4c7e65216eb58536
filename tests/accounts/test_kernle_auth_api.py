"""The kernle auth routes at the HTTP level (docs/kernle-protocol.md §2)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import ApiKey, AuditEvent, Organization, User
from stacks.models import Stack
from tests.factories import bearer_client, make_key, make_org, make_stack, make_user

pytestmark = pytest.mark.django_db


def register(body: object, **extra: Any):
    return APIClient().post("/auth/register", body, format="json", **extra)


def nothing_stored() -> bool:
    return not (User.objects.exists() or Stack.objects.exists() or ApiKey.objects.exists()
                or Organization.objects.exists())


def test_register_creates_user_personal_org_stack_and_bound_key() -> None:
    response = register({"stack_id": "My.Agent_1", "email": "Ada@Example.test"})
    assert response.status_code == 201, response.json()
    body = response.json()
    assert set(body) == {"user_id", "secret", "api_key", "key_id", "access_token", "token_type", "expires_in",
                         "stack_id"}
    assert body["user_id"].startswith("usr_") and len(body["user_id"]) == 16
    assert body["secret"] == body["api_key"] and body["secret"].startswith("knl_sk_") and len(body["secret"]) == 39
    assert body["token_type"] == "bearer" and body["expires_in"] == 604800 and body["stack_id"] == "My.Agent_1"
    key = ApiKey.objects.select_related("stack", "organization", "user").get(public_id=body["key_id"])
    assert key.user.public_id == body["user_id"] and key.user.email == "Ada@Example.test"
    assert key.stack is not None and key.stack.slug == "My.Agent_1" and key.stack.kind == "agent"
    assert key.organization.kind == Organization.Kind.PERSONAL
    assert key.key_hash != body["secret"] and body["secret"] not in str(AuditEvent.objects.values())
    # Both credentials work on an authenticated endpoint.
    for credential in (body["secret"], body["access_token"]):
        listed = bearer_client(credential).get("/auth/keys")
        assert listed.status_code == 200
        assert [k["id"] for k in listed.json()] == [body["key_id"]]


def test_register_accepts_the_legacy_agent_id_body_and_stack_id_wins() -> None:
    legacy = register({"agent_id": "legacy-agent", "display_name": "Legacy"})
    assert legacy.status_code == 201
    assert legacy.json()["stack_id"] == "legacy-agent"
    both = register({"stack_id": "wins", "agent_id": "loses"})
    assert both.status_code == 201 and both.json()["stack_id"] == "wins"
    assert not Stack.objects.filter(slug="loses").exists()


def test_register_without_email_twice_makes_two_accounts() -> None:
    first, second = register({"stack_id": "same"}), register({"stack_id": "same"})
    assert first.status_code == second.status_code == 201
    assert first.json()["user_id"] != second.json()["user_id"]
    assert Stack.objects.filter(slug="same").count() == 2  # each in its own personal organization


def test_duplicate_email_is_409_case_insensitive_and_stores_nothing_more() -> None:
    assert register({"stack_id": "one", "email": "dup@example.test"}).status_code == 201
    counts = (User.objects.count(), Stack.objects.count(), ApiKey.objects.count(), Organization.objects.count())
    response = register({"stack_id": "two", "email": "DUP@example.TEST"})
    assert response.status_code == 409
    assert response.json()["detail"] == "Email already registered"
    assert (User.objects.count(), Stack.objects.count(), ApiKey.objects.count(),
            Organization.objects.count()) == counts


@pytest.mark.parametrize("body", [
    {"stack_id": ""}, {"stack_id": "a/b"}, {"stack_id": "a\\b"}, {"stack_id": ".."}, {"stack_id": "."},
    {"stack_id": "x" * 101}, {"stack_id": 123}, {"stack_id": ["a"]}, {"stack_id": "sp ace"}, {},
    {"stack_id": "ok", "email": "not-an-email"}, {"stack_id": "ok", "email": 5},
])
def test_bad_register_bodies_are_400_with_detail_and_store_nothing(body: dict) -> None:
    response = register(body)
    assert response.status_code == 400, response.content
    assert response.json()["detail"]
    assert response.json()["error"]["code"] in {"invalid_stack_id", "invalid_email", "invalid"}
    assert nothing_stored()


def test_register_accepts_unicode_letters_and_100_characters() -> None:
    assert register({"stack_id": "élève-ß"}).status_code == 201
    assert register({"stack_id": "y" * 100}).status_code == 201


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"text"'])
def test_malformed_register_json_is_400_not_500(raw: bytes) -> None:
    response = APIClient().post("/auth/register", raw, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["detail"]
    assert nothing_stored()


def test_login_with_key_returns_token_with_offset_and_audits() -> None:
    body = register({"stack_id": "agent", "email": "l@example.test"}).json()
    response = bearer_client(body["secret"]).post("/auth/login")
    assert response.status_code == 200
    login = response.json()
    assert login["user_id"] == body["user_id"] and login["stack_id"] == "agent"
    expires = datetime.fromisoformat(login["token_expires"].replace("Z", "+00:00"))
    assert expires.utcoffset() is not None
    assert bearer_client(login["token"]).get("/auth/keys").status_code == 200
    event = AuditEvent.objects.get(action="login.succeeded")
    assert event.actor is not None and event.actor.public_id == body["user_id"] and event.ip == "127.0.0.1"


@pytest.mark.parametrize("header", [None, "Bearer knl_sk_00000000000000000000000000000000", "Basic abc"])
def test_login_refuses_missing_or_bad_credentials_with_401(header: str | None) -> None:
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    response = client.post("/auth/login")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.json()["detail"]


def test_keys_list_is_a_bare_array_including_revoked_keys() -> None:
    body = register({"stack_id": "agent"}).json()
    client = bearer_client(body["secret"])
    created = client.post("/auth/keys", {"name": "ci"}, format="json").json()
    assert client.delete(f"/auth/keys/{created['id']}").status_code == 204
    listed = client.get("/auth/keys").json()
    assert isinstance(listed, list)
    by_id = {k["id"]: k for k in listed}
    assert by_id[created["id"]]["is_active"] is False and by_id[body["key_id"]]["is_active"] is True
    assert set(by_id[created["id"]]) >= {"id", "name", "key_prefix", "created_at", "last_used_at", "is_active"}
    assert by_id[body["key_id"]]["created_at"].endswith("+00:00")
    assert all("key" not in k and "api_key" not in k for k in listed)


def test_keys_create_is_201_with_both_spellings_and_not_stack_bound() -> None:
    body = register({"stack_id": "agent"}).json()
    response = bearer_client(body["secret"]).post("/auth/keys", {"name": "ci"}, format="json")
    assert response.status_code == 201
    created = response.json()
    assert created["id"] == created["key_id"] and created["key"] == created["api_key"]
    assert created["key_prefix"] == created["key"][:12] and created["is_active"] is True
    assert created["expires_at"] is None and created["name"] == "ci"
    key = ApiKey.objects.get(public_id=created["id"])
    assert key.stack_id is None and key.organization.kind == "personal"
    # The unbound key reaches the account's stack.
    assert bearer_client(created["key"]).get("/api/v1/stacks/agent/").status_code == 200
    assert bearer_client(body["secret"]).post("/auth/keys", {}, format="json").status_code == 201


def test_keys_create_rejects_a_bad_name_and_stores_nothing() -> None:
    body = register({"stack_id": "agent"}).json()
    response = bearer_client(body["secret"]).post("/auth/keys", {"name": "n" * 101}, format="json")
    assert response.status_code == 400
    assert ApiKey.objects.count() == 1


def test_revoke_then_the_key_and_its_tokens_get_401() -> None:
    body = register({"stack_id": "agent"}).json()
    client = bearer_client(body["secret"])
    created = client.post("/auth/keys", {"name": "ci"}, format="json").json()
    token = bearer_client(created["key"]).post("/auth/login").json()["token"]
    assert client.delete(f"/auth/keys/{created['id']}").status_code == 204
    assert bearer_client(created["key"]).get("/auth/keys").status_code == 401
    assert bearer_client(token).get("/auth/keys").status_code == 401
    # Revoking the calling key itself is allowed; it then stops working.
    assert client.delete(f"/auth/keys/{body['key_id']}").status_code == 204
    assert client.get("/auth/keys").status_code == 401


def test_revoke_and_cycle_of_someone_elses_key_is_404_and_changes_nothing() -> None:
    mine = register({"stack_id": "mine"}).json()
    theirs = register({"stack_id": "theirs"}).json()
    client = bearer_client(mine["secret"])
    assert client.delete(f"/auth/keys/{theirs['key_id']}").status_code == 404
    assert client.post(f"/auth/keys/{theirs['key_id']}/cycle").status_code == 404
    assert client.delete("/auth/keys/key_unknown").status_code == 404
    assert ApiKey.objects.get(public_id=theirs["key_id"]).revoked_at is None
    assert ApiKey.objects.count() == 2


def test_cycle_returns_flat_fields_and_replaces_the_key_atomically() -> None:
    body = register({"stack_id": "agent"}).json()
    client = bearer_client(body["secret"])
    created = client.post("/auth/keys", {"name": "ci"}, format="json").json()
    response = client.post(f"/auth/keys/{created['id']}/cycle")
    assert response.status_code == 200
    cycled = response.json()
    assert cycled["old_key_id"] == created["id"]
    assert cycled["id"] == cycled["key_id"] == cycled["new_key"]["id"] != created["id"]
    assert cycled["key"] == cycled["api_key"] == cycled["new_key"]["key"]
    assert cycled["name"] == "ci" and cycled["is_active"] is True
    old = ApiKey.objects.get(public_id=created["id"])
    assert old.revoked_at is not None and old.replaced_by is not None and old.replaced_by.public_id == cycled["id"]
    assert bearer_client(created["key"]).post("/auth/login").status_code == 401
    assert bearer_client(cycled["key"]).post("/auth/login").status_code == 200
    again = client.post(f"/auth/keys/{created['id']}/cycle")
    assert again.status_code == 400 and again.json()["detail"]
    assert client.post("/auth/keys/key_unknown/cycle").status_code == 404
    assert {"key.issued", "key.cycled"} <= set(AuditEvent.objects.values_list("action", flat=True))


def test_a_schools_agent_key_cannot_mint_a_school_wide_key() -> None:
    """Escalation guard: in a school, /auth/keys may not turn a stack-bound key into an org key."""
    school = make_org()
    stack = make_stack(school, "student-1")
    _, agent_secret = make_key(school, stack=stack)
    before = ApiKey.objects.count()
    response = bearer_client(agent_secret).post("/auth/keys", {"name": "escalate"}, format="json")
    assert response.status_code == 403
    assert ApiKey.objects.count() == before
    # It still lists only its own stack's keys.
    make_key(school, stack=make_stack(school, "student-2"))
    listed = bearer_client(agent_secret).get("/auth/keys").json()
    assert {k["stack_id"] for k in listed} == {"student-1"}


def test_read_only_key_cannot_create_or_revoke_other_keys() -> None:
    school = make_org()
    admin = make_user(school)
    _, ro_secret = make_key(school, user=admin, read_only=True)
    other, _ = make_key(school, user=admin)
    client = bearer_client(ro_secret)
    assert client.post("/auth/keys", {"name": "x"}, format="json").status_code == 403
    assert client.delete(f"/auth/keys/{other.public_id}").status_code == 403
    assert client.post(f"/auth/keys/{other.public_id}/cycle").status_code == 403
    other.refresh_from_db()
    assert other.revoked_at is None
    assert ApiKey.objects.filter(organization=school).count() == 2


def test_auth_me_names_the_user_account_and_bound_stack() -> None:
    body = register({"stack_id": "agent", "email": "me@example.test"}).json()
    for credential in (body["secret"], body["access_token"]):
        me = bearer_client(credential).get("/auth/me")
        assert me.status_code == 200
        assert me.json()["user_id"] == body["user_id"] and me.json()["email"] == "me@example.test"
        assert me.json()["stack_id"] == "agent" and me.json()["key_id"] == body["key_id"]
        assert me.json()["organization_kind"] == "personal"
    assert APIClient().get("/auth/me").status_code == 401
