"""Every bad credential is a 401 with the error contract and `WWW-Authenticate: Bearer`."""

from __future__ import annotations

from datetime import timedelta

import jwt
import pytest
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient
from rest_framework_simplejwt.tokens import AccessToken

from accounts.authentication import access_token_for_key
from accounts.models import ApiKey
from accounts.services import api_key_revoke
from tests.factories import bearer_client, make_key, make_org, make_stack

pytestmark = pytest.mark.django_db

ENDPOINT = "/api/v1/stacks/"


def assert_401(response) -> None:
    assert response.status_code == 401, response.content
    assert response["WWW-Authenticate"] == "Bearer"
    body = response.json()
    assert body["error"]["code"] and body["error"]["message"] and body["detail"] == body["error"]["message"]


def test_a_valid_key_and_its_token_are_accepted_and_last_used_is_recorded() -> None:
    org = make_org()
    key, secret = make_key(org, stack=make_stack(org, "s1"))
    assert bearer_client(secret).get(ENDPOINT).status_code == 200
    key.refresh_from_db()
    assert key.last_used_at is not None
    assert bearer_client(str(access_token_for_key(key))).get(ENDPOINT).status_code == 200


def test_revoked_key_is_401() -> None:
    key, secret = make_key(make_org())
    api_key_revoke(key=key)
    assert_401(bearer_client(secret).get(ENDPOINT))


def test_expired_key_is_401() -> None:
    key, secret = make_key(make_org())
    ApiKey.objects.filter(pk=key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert_401(bearer_client(secret).get(ENDPOINT))


def test_unknown_key_with_a_real_prefix_is_401() -> None:
    _, secret = make_key(make_org())
    assert_401(bearer_client(secret[:-1] + ("0" if secret[-1] != "0" else "1")).get(ENDPOINT))


def test_forged_jwt_signed_with_another_secret_is_401() -> None:
    key, _ = make_key(make_org())
    claims = dict(access_token_for_key(key).payload)
    forged = jwt.encode(claims, "not-the-server-secret-" * 3, algorithm="HS256")
    assert_401(bearer_client(forged).get(ENDPOINT))


def test_jwt_with_alg_none_is_401() -> None:
    key, _ = make_key(make_org())
    claims = dict(access_token_for_key(key).payload)
    unsigned = jwt.encode(claims, None, algorithm="none")  # type: ignore[arg-type]
    assert_401(bearer_client(unsigned).get(ENDPOINT))


def test_expired_jwt_is_401() -> None:
    key, _ = make_key(make_org())
    token = access_token_for_key(key)
    token.set_exp(from_time=timezone.now() - timedelta(days=8))
    assert_401(bearer_client(str(token)).get(ENDPOINT))


def test_jwt_without_key_claim_is_401() -> None:
    token = AccessToken()
    token["user_id"] = "usr_000000000000"
    assert_401(bearer_client(str(token)).get(ENDPOINT))


def test_jwt_of_a_revoked_key_is_401() -> None:
    key, _ = make_key(make_org())
    token = str(access_token_for_key(key))
    api_key_revoke(key=key)
    assert_401(bearer_client(token).get(ENDPOINT))


@pytest.mark.parametrize("header", [
    "Bearer", "Bearer ", "Bearer a b", "Token knl_sk_abc", "bearer", "Basic dXNlcjpwYXNz",
    "Bearer knl_sk_é", "Bearer not-a-jwt", "Bearer " + "x" * 5000,
])
def test_malformed_authorization_header_is_401(header: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    assert_401(client.get(ENDPOINT))


def test_no_credentials_is_401() -> None:
    assert_401(APIClient().get(ENDPOINT))


def test_jwt_is_hs256_signed_with_the_jwt_signing_key_and_names_user_school_stack_and_scope() -> None:
    org = make_org()
    key, _ = make_key(org, stack=make_stack(org, "bound"), read_only=True)
    assert settings.JWT_SIGNING_KEY != settings.SECRET_KEY
    claims = jwt.decode(str(access_token_for_key(key)), settings.JWT_SIGNING_KEY, algorithms=["HS256"])
    assert claims["user_id"] == claims["sub"] == key.user.public_id
    assert claims["stack_id"] == "bound" and claims["key_id"] == key.public_id
    assert claims["org_id"] == org.public_id and claims["read_only"] is True
    assert claims["exp"] - claims["iat"] == 604800 and claims["jti"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_with_the_database_unreachable_authentication_fails_closed_with_503() -> None:
    """Point the connection at a closed port (a real refused connection): the key cannot be
    checked, so the answer is 503 with Retry-After — never a 200 and never a 500."""
    from memoryhub.embedded import free_port
    from tests.connections import connection_settings

    _, secret = make_key(make_org())
    with connection_settings(PORT=str(free_port())):
        response = bearer_client(secret).get(ENDPOINT)
        register = APIClient().post("/auth/register", {"stack_id": "db-down"}, format="json")
    assert response.status_code == 503, response.content
    assert response["Retry-After"] and response.json()["error"]["code"] == "service_unavailable"
    assert register.status_code == 503
    assert bearer_client(secret).get(ENDPOINT).status_code == 200  # and back once it answers
