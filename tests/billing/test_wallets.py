"""Linking wallets by Sign-In with Ethereum, with real signatures from eth_account: the happy path
and every way a message is refused (replayed, another domain, expired nonce, wrong chain, someone
else's signature), who may link, and unlinking — each school sees and touches only its own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import siwe
from django.conf import settings
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from rest_framework.test import APIClient

from accounts.models import AuditEvent, Membership
from billing.models import SiweNonce, Wallet
from tests.accounts.clients import csrf_session_client
from tests.actors import School
from tests.factories import make_user

pytestmark = pytest.mark.django_db


def billing_client(school: School) -> APIClient:
    """A school's billing member, signed in to the dashboard (CSRF enforced, as the page's JS would)."""
    return csrf_session_client(make_user(school.org, role=Membership.Role.BILLING))


def siwe_message(account: LocalAccount, nonce: str, *, domain: str = "testserver", chain_id: int | None = None,
                 expires_in: timedelta | None = None) -> str:
    issued = datetime.now(UTC)
    fields: dict[str, Any] = {
        "domain": domain, "address": account.address, "uri": f"http://{domain}/dashboard/billing/",
        "version": "1", "chain_id": settings.CHAIN_ID if chain_id is None else chain_id, "nonce": nonce,
        "issued_at": siwe.ISO8601Datetime.from_datetime(issued),
        "statement": "Link this wallet to pay for MemoryHub.",
    }
    if expires_in is not None:
        fields["expiration_time"] = siwe.ISO8601Datetime.from_datetime(issued + expires_in)
    return siwe.SiweMessage(**fields).prepare_message()


def sign(account: LocalAccount, message: str) -> str:
    return "0x" + account.sign_message(encode_defunct(text=message)).signature.hex().removeprefix("0x")


def nonce_for(client: APIClient) -> str:
    response = client.get("/api/v1/wallets/nonce")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["domain"] == "testserver" and body["chain_id"] == settings.CHAIN_ID
    return str(body["nonce"])


def link(client: APIClient, message: str, signature: str) -> Any:
    return client.post("/api/v1/wallets/link", {"message": message, "signature": signature}, format="json")


def test_a_billing_member_links_a_wallet_by_signing_and_the_school_sees_it(school: School) -> None:
    client = billing_client(school)
    account = Account.create()
    message = siwe_message(account, nonce_for(client))
    response = link(client, message, sign(account, message))
    assert response.status_code == 201, response.content
    assert response.json()["address"] == account.address and response.json()["kind"] == "eoa"
    listed = school.admin_api.get("/api/v1/wallets/me").json()["wallets"]
    assert [w["address"] for w in listed] == [account.address]
    assert AuditEvent.objects.filter(organization=school.org, action="wallet.linked",
                                     target_id=account.address).exists()
    # The nonce is stored only as a hash, and is spent.
    assert SiweNonce.objects.filter(organization=school.org, consumed_at__isnull=False).count() == 1


def test_a_second_wallet_links_too_and_relinking_the_same_one_is_not_an_error(school: School) -> None:
    client = billing_client(school)
    first, second = Account.create(), Account.create()
    for account in (first, second):
        message = siwe_message(account, nonce_for(client))
        assert link(client, message, sign(account, message)).status_code == 201
    message = siwe_message(first, nonce_for(client))
    assert link(client, message, sign(first, message)).status_code == 200
    assert Wallet.objects.filter(organization=school.org).count() == 2


def test_a_replayed_message_is_refused(school: School) -> None:
    client = billing_client(school)
    account = Account.create()
    message = siwe_message(account, nonce_for(client))
    signature = sign(account, message)
    assert link(client, message, signature).status_code == 201
    Wallet.objects.filter(organization=school.org).delete()
    replay = link(client, message, signature)
    assert replay.status_code == 400 and replay.json()["error"]["code"] == "siwe_nonce_invalid"
    assert not Wallet.objects.filter(organization=school.org).exists()


def test_a_message_signed_for_another_domain_is_refused(school: School) -> None:
    client = billing_client(school)
    account = Account.create()
    message = siwe_message(account, nonce_for(client), domain="evil.example")
    response = link(client, message, sign(account, message))
    assert response.status_code == 400 and response.json()["error"]["code"] == "siwe_wrong_domain"
    assert not Wallet.objects.exists()


def test_an_expired_nonce_is_refused(school: School) -> None:
    client = billing_client(school)
    account = Account.create()
    message = siwe_message(account, nonce_for(client))
    SiweNonce.objects.filter(organization=school.org).update(expires_at=datetime.now(UTC) - timedelta(seconds=1))
    response = link(client, message, sign(account, message))
    assert response.status_code == 400 and response.json()["error"]["code"] == "siwe_nonce_expired"
    assert not Wallet.objects.exists()


def test_an_expired_message_is_refused(school: School) -> None:
    client = billing_client(school)
    account = Account.create()
    message = siwe_message(account, nonce_for(client), expires_in=timedelta(seconds=-1))
    response = link(client, message, sign(account, message))
    assert response.status_code == 400 and response.json()["error"]["code"] == "siwe_expired"


def test_a_message_for_another_chain_is_refused(school: School) -> None:
    client = billing_client(school)
    account = Account.create()
    message = siwe_message(account, nonce_for(client), chain_id=settings.CHAIN_ID + 1)
    response = link(client, message, sign(account, message))
    assert response.status_code == 400 and response.json()["error"]["code"] == "siwe_wrong_chain"
    assert not Wallet.objects.exists()


def test_a_signature_by_another_key_is_refused(school: School) -> None:
    client = billing_client(school)
    claimed, signer = Account.create(), Account.create()
    message = siwe_message(claimed, nonce_for(client))
    response = link(client, message, sign(signer, message))
    assert response.status_code == 400 and response.json()["error"]["code"] == "siwe_bad_signature"
    assert not Wallet.objects.exists()


def test_garbage_is_a_clear_400(school: School) -> None:
    client = billing_client(school)
    response = link(client, "hello", "0x1234")
    assert response.status_code == 400 and response.json()["error"]["code"] == "siwe_malformed"
    response = client.post("/api/v1/wallets/link", {"message": "x"}, format="json")
    assert response.status_code == 400 and "signature" in response.json()["error"]["fields"]


def test_another_schools_nonce_cannot_be_used(school: School, other_school: School) -> None:
    account = Account.create()
    message = siwe_message(account, nonce_for(billing_client(other_school)))
    response = link(billing_client(school), message, sign(account, message))
    assert response.status_code == 400 and response.json()["error"]["code"] == "siwe_nonce_invalid"
    assert not Wallet.objects.exists()


def test_teachers_and_agent_keys_cannot_link_but_agent_keys_can_read(school: School) -> None:
    teacher = csrf_session_client(school.teacher)
    assert teacher.get("/api/v1/wallets/nonce").status_code == 403
    assert teacher.get("/api/v1/wallets/me").status_code == 403
    response = school.agent.get("/api/v1/wallets/nonce")
    assert response.status_code == 403 and response.json()["error"]["code"] == "billing_manager_required"
    assert school.agent.get("/api/v1/wallets/me").status_code == 200


def test_unlink_removes_the_wallet_and_another_school_cannot(school: School, other_school: School) -> None:
    client = billing_client(school)
    account = Account.create()
    message = siwe_message(account, nonce_for(client))
    assert link(client, message, sign(account, message)).status_code == 201
    assert billing_client(other_school).delete(f"/api/v1/wallets/{account.address}").status_code == 404
    assert other_school.admin_api.get("/api/v1/wallets/me").json()["wallets"] == []
    assert client.delete(f"/api/v1/wallets/{account.address.lower()}").status_code == 204
    assert client.get("/api/v1/wallets/me").json()["wallets"] == []
    assert client.delete(f"/api/v1/wallets/{account.address}").status_code == 404
    assert AuditEvent.objects.filter(organization=school.org, action="wallet.unlinked").count() == 1


def test_the_legacy_claim_route_points_to_siwe(school: School) -> None:
    response = school.admin_api.post("/api/v1/wallets/claim", {"owner_eoa": Account.create().address}, format="json")
    assert response.status_code == 410 and response.json()["error"]["code"] == "wallet_claim_retired"
    assert "/api/v1/wallets/link" in response.json()["detail"]
