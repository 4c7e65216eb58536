"""Linking wallets by Sign-In with Ethereum, with real signatures from eth_account: the happy path
and every way a message is refused (replayed, another domain, expired nonce, wrong chain, someone
else's signature), who may link, and unlinking — each school sees and touches only its own.

Contract wallets (EIP-1271) against the session's Anvil node: contracts/OwnerWallet.sol, compiled
from source, accepts what its owner's key signs; linking asks the contract on chain, another key's
signature is refused, the node down is a 503 (never "bad signature"), and a payment whose sender
is the linked contract wallet activates the tier."""

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

from accounts.models import AuditEvent, Membership, Organization
from billing.models import Payment, SiweNonce, Wallet
from billing.services.payments import recheck_claimed, watch_treasury
from memoryhub.embedded import free_port
from tests.accounts.clients import csrf_session_client
from tests.actors import School
from tests.billing.chain import USDC, DevChain
from tests.billing.test_payments import now_on_chain
from tests.factories import make_org, make_user

pytestmark = pytest.mark.django_db


def billing_client(school: School) -> APIClient:
    """A school's billing member, signed in to the dashboard (CSRF enforced, as the page's JS would)."""
    return csrf_session_client(make_user(school.org, role=Membership.Role.BILLING))


def siwe_message(account: LocalAccount | str, nonce: str, *, domain: str = "testserver", chain_id: int | None = None,
                 expires_in: timedelta | None = None) -> str:
    """The EIP-4361 message linking `account` (a key's account, or a contract wallet's address)."""
    issued = datetime.now(UTC)
    address = account if isinstance(account, str) else account.address
    fields: dict[str, Any] = {
        "domain": domain, "address": address, "uri": f"http://{domain}/dashboard/billing/",
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


# r and s zero (with v 0 or 27), or r past the curve order: bytes no key signs, which eth_keys
# refuses with BadSignature (no ValueError, so siwe lets it through: it was a 500).
NO_SIGNATURES = ["0x" + "00" * 65, "0x" + "00" * 64 + "1b", "0x" + "ff" * 64 + "1b",
                 "0x" + (5).to_bytes(32, "big").hex() + (1).to_bytes(32, "big").hex() + "1b"]


@pytest.mark.parametrize("signature", NO_SIGNATURES)
def test_a_signature_no_key_made_is_a_400_and_links_nothing(school: School, signature: str) -> None:
    client = billing_client(school)
    account = Account.create()
    message = siwe_message(account, nonce_for(client))
    response = link(client, message, signature)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "siwe_bad_signature"
    assert not Wallet.objects.exists() and not AuditEvent.objects.filter(action="wallet.linked").exists()
    # Nothing was spent either: the nonce still links the wallet with its real signature.
    assert link(client, message, sign(account, message)).status_code == 201


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


# ---------------------------------------------------------------------------------------------
# Contract wallets (EIP-1271), on the session's Anvil node


def contract_wallet(chain: DevChain) -> tuple[str, LocalAccount]:
    """A freshly deployed OwnerWallet and its owner's key (an Anvil account, so it can send)."""
    owner = chain.accounts[5]
    return chain.deploy_wallet(owner), Account.from_key(owner.key)


def test_a_contract_wallet_links_with_its_owners_signature(chain: DevChain, school: School) -> None:
    client = billing_client(school)
    wallet, owner = contract_wallet(chain)
    message = siwe_message(wallet, nonce_for(client))  # the message names the contract
    signature = sign(owner, message)
    # Recovering the signer gives the owner, not the wallet: only the contract can vouch for it.
    assert Account.recover_message(encode_defunct(text=message), signature=signature) == owner.address != wallet
    response = link(client, message, signature)
    assert response.status_code == 201, response.content
    assert (response.json()["address"], response.json()["kind"]) == (wallet, "contract")
    assert Wallet.objects.get(organization=school.org).kind == Wallet.Kind.CONTRACT
    event = AuditEvent.objects.get(organization=school.org, action="wallet.linked")
    assert event.target_id == wallet and event.metadata == {"kind": "contract"}


def test_a_contract_wallet_refuses_another_keys_signature(chain: DevChain, school: School) -> None:
    client = billing_client(school)
    wallet, owner = contract_wallet(chain)
    message = siwe_message(wallet, nonce_for(client))
    stranger = Account.from_key(chain.accounts[6].key)
    response = link(client, message, sign(stranger, message))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "siwe_bad_signature" and "EIP-1271" in error["message"] and wallet in error["message"]
    assert not Wallet.objects.exists()
    # Neither the owner's own address (a key, not the wallet) nor a wallet owned by someone else links.
    assert link(client, siwe_message(owner, nonce_for(client)), sign(stranger, message)).status_code == 400
    others_wallet = chain.deploy_wallet(chain.accounts[6])
    other_message = siwe_message(others_wallet, nonce_for(client))
    assert link(client, other_message, sign(owner, other_message)).json()["error"]["code"] == "siwe_bad_signature"
    assert not Wallet.objects.exists()
    # The refusals spent no nonce: the owner's signature of the first message still links.
    assert link(client, message, sign(owner, message)).status_code == 201


@pytest.mark.parametrize("signature", NO_SIGNATURES)
def test_a_signature_no_key_made_is_a_400_with_a_chain_configured(chain: DevChain, school: School,
                                                                  signature: str) -> None:
    """Such bytes go on to the contract check (a contract wallet may accept what no key signs):
    an account's address and a contract wallet that refuses them are both a clear 400."""
    client = billing_client(school)
    account = Account.create()
    message = siwe_message(account, nonce_for(client))
    response = link(client, message, signature)
    assert response.status_code == 400 and response.json()["error"]["code"] == "siwe_bad_signature", response.content
    wallet, owner = contract_wallet(chain)
    wallet_message = siwe_message(wallet, nonce_for(client))
    response = link(client, wallet_message, signature)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "siwe_bad_signature" and "EIP-1271" in error["message"]
    assert not Wallet.objects.exists()
    assert link(client, wallet_message, sign(owner, wallet_message)).status_code == 201


def test_a_contract_wallet_check_needs_the_node_and_its_outage_is_a_503(chain: DevChain, school: School) -> None:
    client = billing_client(school)
    wallet, owner = contract_wallet(chain)
    message = siwe_message(wallet, nonce_for(client))
    signature = sign(owner, message)
    with chain.settings(CHAIN_RPC_URL=f"http://127.0.0.1:{free_port()}", CHAIN_RPC_TIMEOUT_SECONDS=2):
        down = link(client, message, signature)
        # An externally owned account needs no node: it links while the node is down.
        eoa = Account.create()
        eoa_message = siwe_message(eoa, nonce_for(client))
        assert link(client, eoa_message, sign(eoa, eoa_message)).status_code == 201
    assert down.status_code == 503 and down.json()["error"]["code"] == "chain_unavailable", down.content
    assert int(down["Retry-After"]) >= 1
    # Configured for another chain than the node's: the contract at this address proves nothing there.
    with chain.settings(CHAIN_ID=8453):
        other_chain = siwe_message(wallet, nonce_for(client), chain_id=8453)
        response = link(client, other_chain, sign(owner, other_chain))
    assert response.status_code == 503 and response.json()["error"]["code"] == "chain_unavailable"
    assert not Wallet.objects.filter(address=wallet).exists()
    # The node back: the same message (its nonce unspent) links.
    assert link(client, message, signature).status_code == 201
    assert Wallet.objects.get(address=wallet).kind == Wallet.Kind.CONTRACT


def test_a_signature_that_is_not_hex_is_a_clear_400_with_a_chain_configured(chain: DevChain, school: School) -> None:
    """With a node configured, a signature no key made goes on to the contract check, where siwe
    decodes its hex: an odd number of digits must be refused as input, not fail there (a 500).
    129 digits is the treacherous one: eth_account pads it to 65 bytes and recovers some address,
    so it reaches the contract check, whose bytes.fromhex refuses it."""
    client = billing_client(school)
    account = Account.create()
    message = siwe_message(account, nonce_for(client))
    for bad in ("0x1" + "ab" * 64, "0x" + "ab" * 32 + "a", "0x" + "ab" * 65 + "c"):
        response = link(client, message, bad)
        assert response.status_code == 400 and response.json()["error"]["code"] == "siwe_bad_signature", bad
    response = link(client, message, "0xzz")
    assert response.status_code == 400 and "signature" in response.json()["error"]["fields"]
    assert not Wallet.objects.exists()


def test_a_payment_from_a_linked_contract_wallet_activates_the_tier(chain: DevChain) -> None:
    org = make_org(tier="free")
    client = csrf_session_client(make_user(org, role=Membership.Role.BILLING))
    wallet, owner_key = contract_wallet(chain)
    owner = chain.accounts[5]
    chain.send_usdc(owner, wallet, 10 * USDC)  # the wallet holds USDC of its own
    message = siwe_message(wallet, nonce_for(client))
    assert link(client, message, sign(owner_key, message)).status_code == 201
    intent = client.post("/api/v1/subscriptions/upgrade", {"tier": "core"}, format="json").json()

    def confirm(tx_hash: str) -> Any:
        return client.post("/api/v1/subscriptions/payments/confirm",
                           {"payment_id": intent["payment_id"], "tx_hash": tx_hash}, format="json").json()

    # The owner paying from its own key is not the linked wallet paying.
    now_on_chain(chain)
    direct = chain.send_usdc(owner, intent["treasury_address"], intent["amount_base_units"])
    chain.confirm()
    assert confirm(direct)["reason"] == "sender_not_linked"

    now_on_chain(chain)
    tx_hash = chain.send_usdc_from_wallet(wallet, owner, intent["treasury_address"], intent["amount_base_units"])
    assert confirm(tx_hash)["status"] == "pending_verification"
    chain.confirm()
    confirmed = confirm(tx_hash)
    assert confirmed["status"] == "confirmed" and confirmed["tier"] == "core", confirmed
    assert Organization.objects.get(pk=org.pk).tier == "core"
    payment = Payment.objects.get(public_id=intent["payment_id"])
    assert (payment.from_address, payment.tx_hash) == (wallet, tx_hash)
    assert chain.balance(wallet) == 5 * USDC


def test_the_treasury_watcher_matches_a_contract_wallets_payment(chain: DevChain) -> None:
    """Paying without pasting a hash works from a contract wallet too: the watcher ties the
    transfer to the organization by the wallet's address (the Transfer log's sender)."""
    org = make_org(tier="free")
    client = csrf_session_client(make_user(org, role=Membership.Role.BILLING))
    wallet, owner_key = contract_wallet(chain)
    owner = chain.accounts[5]
    chain.send_usdc(owner, wallet, 5 * USDC)
    message = siwe_message(wallet, nonce_for(client))
    assert link(client, message, sign(owner_key, message)).status_code == 201
    intent = client.post("/api/v1/subscriptions/upgrade", {"tier": "core"}, format="json").json()
    now_on_chain(chain)
    tx_hash = chain.send_usdc_from_wallet(wallet, owner, intent["treasury_address"], intent["amount_base_units"])
    assert watch_treasury().claimed == 1
    payment = Payment.objects.get(public_id=intent["payment_id"])
    assert (payment.status, payment.tx_hash, payment.from_address) == ("pending_verification", tx_hash, wallet)
    chain.confirm()
    assert recheck_claimed() == {"confirmed": 1}
    assert Organization.objects.get(pk=org.pk).tier == "core"
