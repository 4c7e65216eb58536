"""Paying for a tier on a real chain (the session's Anvil node with the compiled TestUSDC): link a
wallet by SIWE, upgrade, transfer, `pending_verification`, mine, `confirmed`, tier and quotas
raised — by pasting the hash or by simply sending (the treasury watcher). One transfer pays once,
even with two confirms racing; a sender not linked, an expired intent and a reorg before finality
are refused or undone with nothing left activated."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import siwe
from django.core import mail
from django.db import connection
from eth_account import Account
from eth_account.messages import encode_defunct
from rest_framework.test import APIClient

from accounts.models import AuditEvent, Membership, Organization
from accounts.principal import Principal
from accounts.tiers import GB, MB
from billing.entitlements import storage_remaining
from billing.models import Payment, Subscription
from billing.selectors import payment_for
from billing.services.payments import confirm, recheck_claimed, watch_treasury
from memoryhub.errors import DomainError
from tests.accounts.clients import csrf_session_client
from tests.billing.chain import USDC, DevAccount, DevChain
from tests.factories import make_org, make_stack, make_user

pytestmark = pytest.mark.django_db


def now_on_chain(chain: DevChain) -> None:
    """Stamp the next block with the wall clock (never before the latest block). Anvil's clock does
    not follow the wall clock across snapshot reverts, and a transfer must be mined after its
    intent was created (billing.chain's before_intent)."""
    latest = int(chain.block_time(chain.head()).timestamp())
    chain.rpc("evm_setNextBlockTimestamp", hex(max(latest + 1, int(time.time()) + 1)))


class Payer:
    """A school on the free tier, its billing member signed in to the dashboard, and a funded wallet."""

    def __init__(self, chain: DevChain, wallet: DevAccount) -> None:
        self.chain = chain
        self.org = make_org(tier="free")
        self.user = make_user(self.org, role=Membership.Role.BILLING)
        self.client: APIClient = csrf_session_client(self.user)
        self.wallet = wallet

    @property
    def principal(self) -> Principal:
        return Principal(user=self.user, organization=Organization.objects.get(pk=self.org.pk),
                         role=Membership.Role.BILLING)

    def link_wallet(self) -> None:
        nonce = self.client.get("/api/v1/wallets/nonce").json()
        message = siwe.SiweMessage(
            domain=nonce["domain"], address=self.wallet.address, uri="http://testserver/dashboard/billing/",
            version="1", chain_id=nonce["chain_id"], nonce=nonce["nonce"],
            issued_at=siwe.ISO8601Datetime.from_datetime(datetime.now(UTC))).prepare_message()
        signature = Account.from_key(self.wallet.key).sign_message(encode_defunct(text=message)).signature.hex()
        response = self.client.post("/api/v1/wallets/link", {"message": message, "signature": "0x" +
                                                             signature.removeprefix("0x")}, format="json")
        assert response.status_code == 201, response.content

    def upgrade(self, tier: str = "pro") -> dict[str, Any]:
        response = self.client.post("/api/v1/subscriptions/upgrade", {"tier": tier}, format="json")
        assert response.status_code == 201, response.content
        return dict(response.json())

    def pay(self, intent: dict[str, Any]) -> str:
        now_on_chain(self.chain)
        return self.chain.send_usdc(self.wallet, intent["treasury_address"], intent["amount_base_units"])

    def confirm(self, payment_id: str, tx_hash: str) -> Any:
        return self.client.post("/api/v1/subscriptions/payments/confirm",
                                {"payment_id": payment_id, "tx_hash": tx_hash}, format="json")

    def tier(self) -> str:
        return Organization.objects.get(pk=self.org.pk).tier


@pytest.fixture
def payer(chain: DevChain) -> Payer:
    return Payer(chain, chain.accounts[0])


def test_link_upgrade_pay_confirm_raises_the_tier_and_its_quotas(chain: DevChain, payer: Payer) -> None:
    make_stack(payer.org, "first")
    payer.link_wallet()
    intent = payer.upgrade("pro")
    assert intent["amount"] == "15" and intent["amount_base_units"] == 15 * USDC
    assert intent["treasury_address"] == chain.treasury.address and intent["usdc_contract"] == chain.usdc
    tx_hash = payer.pay(intent)

    pending = payer.confirm(intent["payment_id"], tx_hash)
    assert pending.status_code == 200 and pending.json()["status"] == "pending_verification", pending.content
    assert payer.tier() == "free" and pending.json()["activated_at"] is None

    chain.confirm()
    confirmed = payer.confirm(intent["payment_id"], tx_hash).json()
    assert confirmed["status"] == "confirmed" and confirmed["tier"] == "pro" and confirmed["activated_at"]
    assert payer.tier() == "pro"
    me = payer.client.get("/api/v1/subscriptions/me").json()
    assert me["subscription"]["tier"] == "pro" and me["subscription"]["status"] == "active"
    assert me["subscription"]["renewal_amount"] == "15" and me["subscription"]["auto_renew"] is True
    assert me["usage"]["storage_limit"] == 1 * GB and me["usage"]["agents_limit"] == 10
    make_stack(Organization.objects.get(pk=payer.org.pk), "second")  # the free tier allowed one active stack
    listed = payer.client.get("/api/v1/subscriptions/payments").json()["payments"]
    assert [(p["status"], p["tx_hash"], p["from_address"]) for p in listed] == [
        ("confirmed", tx_hash, payer.wallet.address)]
    assert listed[0]["to_address"] == chain.treasury.address and listed[0]["chain"] == "anvil"
    again = payer.confirm(intent["payment_id"], tx_hash)
    assert again.status_code == 400 and again.json()["error"]["code"] == "payment_already_confirmed"
    assert AuditEvent.objects.filter(organization=payer.org, action="billing.payment_confirmed").count() == 1


def test_a_transfer_from_a_wallet_not_linked_pays_nothing(chain: DevChain, payer: Payer) -> None:
    payer.link_wallet()
    intent = payer.upgrade("core")
    now_on_chain(chain)
    tx_hash = chain.send_usdc(chain.accounts[1], chain.treasury.address, 5 * USDC)
    chain.confirm()
    refused = payer.confirm(intent["payment_id"], tx_hash).json()
    assert refused["status"] == "failed" and refused["reason"] == "sender_not_linked"
    assert payer.tier() == "free" and not Subscription.objects.filter(organization=payer.org, tier="core").exists()
    payment = Payment.objects.get(public_id=intent["payment_id"])
    assert payment.status == "pending" and payment.tx_hash is None  # the intent may still be paid properly


def test_the_same_transfer_cannot_pay_two_intents(chain: DevChain, payer: Payer) -> None:
    payer.link_wallet()
    first, second = payer.upgrade("core"), payer.upgrade("core")
    tx_hash = payer.pay(first)
    claimed = payer.confirm(first["payment_id"], tx_hash).json()
    assert claimed["status"] == "pending_verification", claimed
    reused = payer.confirm(second["payment_id"], tx_hash)
    assert reused.status_code == 409 and reused.json()["error"]["code"] == "transfer_already_claimed"
    chain.confirm()
    assert payer.confirm(first["payment_id"], tx_hash).json()["status"] == "confirmed"
    assert Payment.objects.get(public_id=second["payment_id"]).tx_hash is None


def test_an_expired_intent_cannot_be_paid(chain: DevChain, payer: Payer) -> None:
    payer.link_wallet()
    intent = payer.upgrade("core")
    tx_hash = payer.pay(intent)
    chain.confirm()
    Payment.objects.filter(public_id=intent["payment_id"]).update(
        expires_at=datetime.now(UTC) - timedelta(seconds=1))
    response = payer.confirm(intent["payment_id"], tx_hash)
    assert response.status_code == 400 and response.json()["error"]["code"] == "payment_expired"
    assert payer.tier() == "free"


def test_sending_the_amount_is_enough_the_watcher_matches_it(chain: DevChain, payer: Payer) -> None:
    payer.link_wallet()
    intent = payer.upgrade("core")
    now_on_chain(chain)
    chain.send_usdc(chain.accounts[1], chain.treasury.address, 5 * USDC)  # someone else's: not ours
    tx_hash = payer.pay(intent)
    report = watch_treasury()
    assert report.transfers >= 2 and report.claimed == 1
    payment = Payment.objects.get(public_id=intent["payment_id"])
    assert payment.status == "pending_verification" and payment.tx_hash == tx_hash
    assert watch_treasury().transfers == 0  # the cursor moved on
    chain.confirm()
    assert recheck_claimed() == {"confirmed": 1}
    assert payer.tier() == "core"


def test_the_watcher_does_not_take_a_transfer_sent_before_the_intent(chain: DevChain, payer: Payer) -> None:
    """Money sent before the payment was asked for pays nothing: an old transfer of the right amount
    from the right wallet is not matched to a newer intent (it could be last month's payment)."""
    payer.link_wallet()
    now_on_chain(chain)
    old_hash = chain.send_usdc(payer.wallet, chain.treasury.address, 5 * USDC)
    sent_at = chain.block_time(chain.head())
    intent = payer.upgrade("core")
    # The intent is stamped a few seconds after the transfer's block (the chain's clock may run ahead
    # of the wall clock after earlier tests' mining; the rule compares the two).
    Payment.objects.filter(public_id=intent["payment_id"]).update(created_at=sent_at + timedelta(seconds=5))
    chain.confirm()
    report = watch_treasury()
    assert report.transfers >= 1 and report.claimed == 0
    payment = Payment.objects.get(public_id=intent["payment_id"])
    assert payment.status == "pending" and payment.tx_hash in (None, "")
    response = payer.confirm(intent["payment_id"], old_hash)  # pasting the hash is refused the same way
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "failed" and response.json()["reason"] == "before_intent"
    assert payer.tier() == "free"


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_confirms_of_one_transfer_cannot_both_win(chain: DevChain) -> None:
    payer = Payer(chain, chain.accounts[2])
    payer.link_wallet()
    intents = [payer.upgrade("core"), payer.upgrade("core")]
    tx_hash = payer.pay(intents[0])
    chain.confirm()
    principal = payer.principal
    outcomes: list[str] = []
    start = threading.Barrier(2)

    def attempt(payment_id: str) -> None:
        try:
            payment = payment_for(principal, payment_id)
            start.wait(timeout=10)
            outcomes.append(confirm(principal=principal, payment=payment, tx_hash=tx_hash).status)
        except DomainError as error:
            outcomes.append(error.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt, args=(i["payment_id"],)) for i in intents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes).count("confirmed") == 1, outcomes
    assert len(outcomes) == 2 and set(outcomes) - {"confirmed"} <= {"transfer_already_claimed", "payment_expired"}
    assert Payment.objects.filter(organization=payer.org, status="confirmed").count() == 1
    assert AuditEvent.objects.filter(organization=payer.org, action="billing.payment_confirmed").count() == 1


def test_a_reorg_before_finality_reverts_the_activation_and_tells_the_admins(
        chain: DevChain, payer: Payer, django_capture_on_commit_callbacks: Any) -> None:
    admin = make_user(payer.org, role=Membership.Role.ADMIN)
    payer.link_wallet()
    intent = payer.upgrade("pro")
    before = chain.snapshot()
    tx_hash = payer.pay(intent)
    chain.confirm()
    assert payer.confirm(intent["payment_id"], tx_hash).json()["status"] == "confirmed"
    assert payer.tier() == "pro"
    chain.revert(before)  # the blocks holding the transfer are gone
    with django_capture_on_commit_callbacks(execute=True):
        assert recheck_claimed() == {"reverted": 1}
    assert payer.tier() == "free"
    subscription = Subscription.objects.get(organization=payer.org)
    assert subscription.tier == "free" and subscription.renews_at is None
    assert Payment.objects.get(public_id=intent["payment_id"]).failure_reason == "reorg"
    assert AuditEvent.objects.filter(organization=payer.org, action="billing.payment_reverted").exists()
    assert len(mail.outbox) == 1 and admin.email in mail.outbox[0].to and tx_hash in mail.outbox[0].body


def test_a_confirmed_payment_becomes_final_and_is_no_longer_watched(chain: DevChain, payer: Payer) -> None:
    payer.link_wallet()
    intent = payer.upgrade("core")
    tx_hash = payer.pay(intent)
    chain.confirm()
    assert payer.confirm(intent["payment_id"], tx_hash).json()["status"] == "confirmed"
    assert recheck_claimed() == {"confirmed": 1}  # not deep enough to be final yet
    chain.mine(chain.confirmations)
    recheck_claimed()
    assert Payment.objects.get(public_id=intent["payment_id"]).finalized_at is not None
    assert recheck_claimed() == {}


def test_storage_quota_is_raised_with_the_tier(chain: DevChain, payer: Payer) -> None:
    stack = make_stack(payer.org, "ada", bytes_used=10 * MB)
    assert storage_remaining(organization=stack.organization) == 0
    payer.link_wallet()
    intent = payer.upgrade("core")
    tx_hash = payer.pay(intent)
    chain.confirm()
    assert payer.confirm(intent["payment_id"], tx_hash).json()["status"] == "confirmed"
    # Core has overflow prices: a paid core school is metered, not refused.
    assert storage_remaining(organization=Organization.objects.get(pk=payer.org.pk)) is None
