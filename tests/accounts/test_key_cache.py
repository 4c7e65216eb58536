"""The per-process memory of verified API keys (accounts/key_cache.py): a busy key is not looked up
on every request, and every change that can take access away still takes effect on the next one."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts import key_cache
from accounts.authentication import access_token_for_key
from accounts.models import ApiKey, Membership
from accounts.selectors import api_key_hash
from accounts.services import api_key_revoke, membership_role_change
from stacks.services import teacher_assign, teacher_unassign
from tests.factories import bearer_client, make_key, make_org, make_stack, make_user

pytestmark = pytest.mark.django_db(transaction=True)

ENDPOINT = "/api/v1/stacks/"


@pytest.fixture(autouse=True)
def empty_cache() -> None:
    key_cache.forget_all()


def key_queries(client: Any) -> tuple[int, int]:
    """(status, how many queries read the API-key table) of one request."""
    with CaptureQueriesContext(connection) as queries:
        status = client.get(ENDPOINT).status_code
    return status, sum(1 for q in queries if 'FROM "accounts_apikey"' in q["sql"])


def redis() -> Any:
    return cache._cache.get_client(key_cache.generation_key(), write=True)  # type: ignore[attr-defined]


def generation() -> bytes | None:
    value: bytes | None = redis().get(key_cache.generation_key())
    return value


def test_a_key_that_verified_is_not_looked_up_again() -> None:
    org = make_org()
    _, secret = make_key(org, stack=make_stack(org, "s1"))
    client = bearer_client(secret)
    assert key_queries(client) == (200, 1)
    assert key_queries(client) == (200, 0)
    assert key_queries(client) == (200, 0)


def token_client(key: ApiKey) -> Any:
    """A client holding an access token issued from `key`, as kernle's client does after login."""
    return bearer_client(str(access_token_for_key(key)))


# The two credentials a client may send: the key's secret, or a token issued from the key.
CREDENTIALS = {"key": lambda key, secret: bearer_client(secret), "token": lambda key, secret: token_client(key)}


@pytest.mark.parametrize("credential", sorted(CREDENTIALS))
def test_a_revocation_takes_effect_on_the_next_request(credential: str) -> None:
    key, secret = make_key(make_org())
    client = CREDENTIALS[credential](key, secret)
    assert key_queries(client) == (200, 1)
    api_key_revoke(key=key)
    assert client.get(ENDPOINT).status_code == 401


@pytest.mark.parametrize("credential", sorted(CREDENTIALS))
def test_a_change_made_by_another_process_takes_effect_through_the_generation(credential: str) -> None:
    key, secret = make_key(make_org())
    client = CREDENTIALS[credential](key, secret)
    assert key_queries(client) == (200, 1)
    # Another process revokes: its row change bypasses this process's signals (a bare UPDATE here)…
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())
    assert client.get(ENDPOINT).status_code == 200  # (remembered: only the entry's lifetime bounds this)
    # …and, as its post_save does after commit, bumps the generation every process reads.
    redis().incr(key_cache.generation_key())
    assert client.get(ENDPOINT).status_code == 401


def test_a_committed_change_bumps_the_generation() -> None:
    org = make_org()
    teacher = make_user(org, role=Membership.Role.TEACHER)
    before = int(generation() or 0)
    membership_role_change(organization=org, user_public_id=teacher.public_id, role=Membership.Role.BILLING)
    assert int(generation() or 0) > before


def test_an_unassigned_teachers_key_is_refused_on_the_next_request() -> None:
    org = make_org()
    stack = make_stack(org, "s1")
    teacher = make_user(org, role=Membership.Role.TEACHER)
    teacher_assign(stack=stack, teacher=teacher)
    _, secret = make_key(org, stack=stack, user=teacher)
    client = bearer_client(secret)
    assert key_queries(client) == (200, 1)
    assert key_queries(client) == (200, 0)
    teacher_unassign(stack=stack, teacher=teacher)
    assert client.get(ENDPOINT).status_code == 401


def test_an_entry_lives_at_most_its_lifetime(settings: Any) -> None:
    settings.AUTH_KEY_CACHE_SECONDS = 0.3
    key, secret = make_key(make_org())
    client = bearer_client(secret)
    assert key_queries(client) == (200, 1)
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())  # no signal, no bump
    time.sleep(0.4)
    assert client.get(ENDPOINT).status_code == 401


def test_an_operator_ends_every_entry_after_a_revocation_by_hand() -> None:
    key, secret = make_key(make_org())
    client = bearer_client(secret)
    assert key_queries(client) == (200, 1)
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())  # SQL by hand: no signal
    assert client.get(ENDPOINT).status_code == 200  # remembered, for up to the lifetime
    before = generation()
    key_cache.forget_everywhere()
    assert generation() != before  # the other processes drop theirs on their next request
    assert client.get(ENDPOINT).status_code == 401


def test_an_entry_never_outlives_the_keys_expiry() -> None:
    key, secret = make_key(make_org())
    ApiKey.objects.filter(pk=key.pk).update(expires_at=timezone.now() + timedelta(seconds=0.5))
    client = bearer_client(secret)
    assert key_queries(client) == (200, 1)
    time.sleep(0.6)
    assert client.get(ENDPOINT).status_code == 401


def test_off_when_the_lifetime_is_zero(settings: Any) -> None:
    settings.AUTH_KEY_CACHE_SECONDS = 0
    _, secret = make_key(make_org())
    client = bearer_client(secret)
    assert key_queries(client) == (200, 1)
    assert key_queries(client) == (200, 1)


def test_every_request_gets_its_own_copy_and_the_secret_is_not_kept() -> None:
    _, secret = make_key(make_org())
    assert bearer_client(secret).get(ENDPOINT).status_code == 200
    digest = api_key_hash(secret)
    first, second = key_cache.lookup(digest, generation()), key_cache.lookup(digest, generation())
    assert first is not None and second is not None
    assert first.key is not second.key and first.key.organization is not second.key.organization
    first.key.organization.tier = "changed by one request"
    assert second.key.organization.tier != "changed by one request"
    assert all(secret.encode() not in entry.payload and entry_key != secret
               for entry_key, entry in key_cache._entries.items())


def test_the_key_a_token_names_is_not_looked_up_again() -> None:
    org = make_org()
    key, _ = make_key(org, stack=make_stack(org, "s1"))
    token = str(access_token_for_key(key))
    client = bearer_client(token)
    assert key_queries(client) == (200, 1)
    assert key_queries(client) == (200, 0)
    assert key_queries(token_client(key)) == (200, 0)  # another token of the same key
    assert "token:" + key.public_id in key_cache._entries
    assert all(token not in entry_key and token.encode() not in entry.payload  # the token itself is not kept
               for entry_key, entry in key_cache._entries.items())


def test_a_token_still_must_match_the_remembered_key() -> None:
    """The cache holds the key, not the token: each token's bound claims are checked on every use."""
    org, elsewhere = make_org(), make_org()  # (made first: a new school's save empties the cache)
    key, _ = make_key(org, stack=make_stack(org, "s1"))
    assert key_queries(token_client(key)) == (200, 1)
    forged_scope = access_token_for_key(key)
    forged_scope["read_only"] = True  # signed, but bound to a scope the key does not have
    assert key_queries(bearer_client(str(forged_scope))) == (401, 0)
    other_school = access_token_for_key(key)
    other_school["org_id"] = elsewhere.public_id
    assert key_queries(bearer_client(str(other_school))) == (401, 0)
