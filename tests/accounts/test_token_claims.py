"""An access token verified once is remembered, and still refused once it expires or is altered."""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from accounts import token_claims
from accounts.authentication import access_token_for_key
from tests.factories import bearer_client, make_key, make_org, make_stack

pytestmark = pytest.mark.django_db(transaction=True)

ENDPOINT = "/api/v1/stacks/"


@pytest.fixture(autouse=True)
def nothing_remembered() -> None:
    token_claims.forget_all()


def test_a_token_is_verified_once_and_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    org = make_org()
    key, _ = make_key(org, stack=make_stack(org, "s1"))
    token = str(access_token_for_key(key))
    verified: list[str] = []
    real = token_claims.AccessToken

    def counting(raw: str) -> Any:
        verified.append(raw)
        return real(raw)  # type: ignore[arg-type]

    monkeypatch.setattr(token_claims, "AccessToken", counting)
    client = bearer_client(token)
    assert [client.get(ENDPOINT).status_code for _ in range(3)] == [200, 200, 200]
    assert verified == [token]
    # Remembered under its digest, not as itself.
    assert list(token_claims._claims) == [hashlib.blake2b(token.encode(), digest_size=32).digest()]


def test_an_altered_token_is_refused_after_the_real_one_was_remembered() -> None:
    key, _ = make_key(make_org())
    token = str(access_token_for_key(key))
    assert bearer_client(token).get(ENDPOINT).status_code == 200
    header, payload, signature = token.split(".")
    altered = ".".join([header, payload, ("A" if signature[0] != "A" else "B") + signature[1:]])
    response = bearer_client(altered).get(ENDPOINT)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_token"


def test_a_remembered_token_is_refused_once_it_expires() -> None:
    key, _ = make_key(make_org())
    token = access_token_for_key(key)
    token.set_exp(from_time=datetime.now(UTC).replace(microsecond=0), lifetime=timedelta(seconds=2))
    client = bearer_client(str(token))
    assert client.get(ENDPOINT).status_code == 200
    while time.time() <= token["exp"]:
        time.sleep(0.1)
    response = client.get(ENDPOINT)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_token"

