"""Agents pay over HTTP 402 (x402 `exact`, EIP-3009) on `POST /api/v1/subscriptions/upgrade`,
settled by MemoryHub on the session's real Anvil node: docs/billing.md's own client end to end (402 →
signed retry → pending_verification → mine → confirmed → tier and quotas), and a tampered or
replayed authorization refused with nothing sent and nothing activated."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import Client
from eth_account import Account
from rest_framework.test import APIClient
from x402 import x402ClientSync
from x402.http import x402HTTPClientSync
from x402.mechanisms.evm import EthAccountSigner
from x402.mechanisms.evm.exact import register_exact_evm_client

from accounts.models import AuditEvent, Organization
from accounts.tiers import MB
from billing.models import Payment
from memoryhub.embedded import free_port
from tests.billing.chain import USDC, DevAccount, DevChain
from tests.billing.test_payments import now_on_chain
from tests.factories import bearer_client, make_key, make_org, make_stack

pytestmark = pytest.mark.django_db

BILLING_DOC = Path(__file__).resolve().parents[2] / "docs" / "billing.md"
UPGRADE = "/api/v1/subscriptions/upgrade"
CORE = 5 * USDC


def readme_client() -> dict[str, Any]:
    """The x402 client of docs/billing.md §4, executed from the page's own text."""
    text = BILLING_DOC.read_text()
    section = text[text.index("## §4 Agents pay over HTTP 402 (x402)"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    namespace: dict[str, Any] = {"__name__": "readme_x402"}
    exec(compile(code.group(1), "docs/billing.md", "exec"), namespace)  # noqa: S102 - our own docs' snippet
    return namespace


def http_for(client: Client, secret: str) -> httpx.Client:
    """An httpx client whose requests Django's test client serves in-process (same database
    transaction as the test), so the page's httpx code runs unchanged."""

    def handle(request: httpx.Request) -> httpx.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in {"host", "content-length",
                                                                                 "content-type"}}
        response = client.generic(request.method, request.url.raw_path.decode(), data=request.content,
                                  content_type=request.headers.get("content-type", ""), headers=headers)
        return httpx.Response(response.status_code, headers=list(response.items()), content=response.content,
                              request=request)

    return httpx.Client(transport=httpx.MockTransport(handle), base_url="http://testserver",
                        headers={"Authorization": f"Bearer {secret}"})


class Agent:
    """A self-registered agent's personal account on free, its own key and its funded wallet."""

    def __init__(self, chain: DevChain, wallet: DevAccount) -> None:
        self.chain = chain
        self.org = make_org(kind=Organization.Kind.PERSONAL, tier="free")
        self.stack = make_stack(self.org, "me")
        _, self.secret = make_key(self.org, stack=self.stack)
        self.api: APIClient = bearer_client(self.secret)
        self.wallet = wallet
        self.snippet = readme_client()
        self.snippet["SPEND_CONTROLS"] = {"allowed_assets": [
            {"network": "eip155:31337", "asset": chain.usdc, "max_amount_per_payment": str(15 * USDC)}]}
        self.http = http_for(Client(), self.secret)

    def link(self) -> None:
        self.snippet["link_wallet"](self.http, Account.from_key(self.wallet.key))

    def signed_header(self, quote: Any) -> str:
        client = x402ClientSync().set_spend_controls(self.snippet["SPEND_CONTROLS"])
        register_exact_evm_client(client, EthAccountSigner(Account.from_key(self.wallet.key)))
        headers, _ = x402HTTPClientSync(client).handle_402_response(
            {"PAYMENT-REQUIRED": quote["PAYMENT-REQUIRED"]}, quote.content, "http://testserver" + UPGRADE)
        return str(headers["PAYMENT-SIGNATURE"])

    def quote(self, tier: str = "core") -> Any:
        response = self.api.post(UPGRADE, {"tier": tier, "pay_with": "x402"}, format="json")
        assert response.status_code == 402, response.content
        return response

    def send(self, header: str, tier: str = "core") -> Any:
        now_on_chain(self.chain)
        return self.api.post(UPGRADE, {"tier": tier, "pay_with": "x402"}, format="json",
                             HTTP_PAYMENT_SIGNATURE=header)

    def tier(self) -> str:
        return Organization.objects.get(pk=self.org.pk).tier


@pytest.fixture
def agent(chain: DevChain) -> Agent:
    return Agent(chain, chain.accounts[3])


def test_the_readme_client_upgrades_over_x402_end_to_end(chain: DevChain, agent: Agent) -> None:
    agent.link()
    treasury_before = chain.balance(chain.treasury.address)
    eth_before = chain.w3.eth.get_balance(agent.wallet.address)

    # The quote: 402 with x402 v2 PaymentRequirements in the body and the header; nothing stored.
    quote = agent.quote()
    body = quote.json()
    assert body["x402Version"] == 2 and quote["PAYMENT-REQUIRED"]
    [accepts] = body["accepts"]
    assert (accepts["scheme"], accepts["network"], accepts["amount"]) == ("exact", "eip155:31337", str(CORE))
    assert accepts["payTo"] == chain.treasury.address and accepts["asset"].lower() == chain.usdc.lower()
    assert not Payment.objects.filter(organization=agent.org).exists()

    now_on_chain(chain)
    paid = agent.snippet["pay_with_x402"](agent.http, Account.from_key(agent.wallet.key), "core")
    assert paid["status"] == "pending_verification" and paid["activated_at"] is None, paid
    assert agent.tier() == "free"
    assert chain.balance(chain.treasury.address) == treasury_before + CORE
    assert chain.w3.eth.get_balance(agent.wallet.address) == eth_before  # our relayer paid the gas
    payment = Payment.objects.get(public_id=paid["payment_id"])
    assert (payment.status, payment.tx_hash, payment.from_address) == (
        "pending_verification", paid["tx_hash"], agent.wallet.address)

    chain.confirm()
    confirmed = agent.snippet["wait_until_confirmed"](agent.http, paid)
    assert confirmed["status"] == "confirmed" and confirmed["tier"] == "core" and confirmed["activated_at"]
    assert agent.tier() == "core"
    usage = agent.api.get("/api/v1/usage/me").json()["usage"]
    assert usage["agents_limit"] == 3 and usage["storage_limit"] == 100 * MB
    make_stack(Organization.objects.get(pk=agent.org.pk), "second")  # free allowed one active stack
    listed = agent.api.get("/api/v1/subscriptions/payments").json()["payments"]
    assert [(p["status"], p["tx_hash"]) for p in listed] == [("confirmed", paid["tx_hash"])]


def test_the_paid_answer_carries_the_x402_settlement_header(chain: DevChain, agent: Agent) -> None:
    agent.link()
    response = agent.send(agent.signed_header(agent.quote()))
    assert response.status_code == 200, response.content
    settlement = json.loads(base64.b64decode(response["PAYMENT-RESPONSE"]))
    assert settlement["success"] is True and settlement["transaction"] == response.json()["tx_hash"]
    assert settlement["payer"] == agent.wallet.address


def _tampered(header: str) -> str:
    payload = json.loads(base64.b64decode(header))
    signature = payload["payload"]["signature"]
    payload["payload"]["signature"] = signature[:-4] + ("00" if signature[-4:-2] != "00" else "11") + signature[-2:]
    return base64.b64encode(json.dumps(payload).encode()).decode()


def test_a_tampered_signature_is_refused_with_nothing_sent_or_activated(chain: DevChain, agent: Agent) -> None:
    agent.link()
    relayer_nonce = chain.w3.eth.get_transaction_count(chain.relayer.address)
    treasury_before = chain.balance(chain.treasury.address)
    header = agent.signed_header(agent.quote())

    refused = agent.send(_tampered(header))
    assert refused.status_code == 422, refused.content
    error = refused.json()["error"]
    assert error["code"] == "payment_refused" and error["fields"]["reason"] == ["bad_signature"]
    assert chain.w3.eth.get_transaction_count(chain.relayer.address) == relayer_nonce  # nothing submitted
    assert chain.balance(chain.treasury.address) == treasury_before
    assert agent.tier() == "free"
    [payment] = Payment.objects.filter(organization=agent.org)
    assert (payment.status, payment.failure_reason, payment.tx_hash) == ("failed", "x402_bad_signature", None)
    assert AuditEvent.objects.filter(organization=agent.org, action="billing.transfer_refused").exists()


def _signed_with(header: str, signature: str) -> str:
    payload = json.loads(base64.b64decode(header))
    payload["payload"]["signature"] = signature
    return base64.b64encode(json.dumps(payload).encode()).decode()


ZERO_SIGNATURE = "0x" + "00" * 65
# r = 5 is no point's x coordinate: a well-formed signature that eth_keys cannot recover from
# (BadSignature, like the zero one) — it reaches the signature check itself.
NO_POINT_SIGNATURE = "0x" + (5).to_bytes(32, "big").hex() + (1).to_bytes(32, "big").hex() + "1b"


@pytest.mark.parametrize("signature", [ZERO_SIGNATURE, "0x" + "00" * 64 + "1b", "0x" + "ff" * 64 + "1c",
                                       "0x" + "11" * 64 + "05"])
def test_a_signature_that_is_no_signature_is_a_400_that_stores_and_sends_nothing(
        chain: DevChain, agent: Agent, signature: str) -> None:
    """0x00…00 (and r, s zero or past the curve order, or an unknown v) was a 500 that left a
    pending intent behind: eth_keys' BadSignature is no ValueError."""
    agent.link()
    relayer_nonce = chain.w3.eth.get_transaction_count(chain.relayer.address)
    header = agent.signed_header(agent.quote())

    refused = agent.send(_signed_with(header, signature))
    assert refused.status_code == 400, refused.content
    error = refused.json()["error"]
    assert error["code"] == "invalid_signature" and "signature" in error["fields"]
    assert not Payment.objects.exists()
    assert not AuditEvent.objects.filter(organization=agent.org, action__startswith="billing.").exists()
    assert chain.w3.eth.get_transaction_count(chain.relayer.address) == relayer_nonce
    assert agent.tier() == "free"
    # The real signature of the same authorization still pays.
    assert agent.send(header).status_code == 200


def test_a_signature_no_key_can_have_made_is_refused_as_bad_and_never_left_pending(
        chain: DevChain, agent: Agent) -> None:
    agent.link()
    relayer_nonce = chain.w3.eth.get_transaction_count(chain.relayer.address)
    refused = agent.send(_signed_with(agent.signed_header(agent.quote()), NO_POINT_SIGNATURE))
    assert refused.status_code == 422, refused.content
    assert refused.json()["error"]["fields"]["reason"] == ["bad_signature"]
    [payment] = Payment.objects.filter(organization=agent.org)
    assert (payment.status, payment.failure_reason) == ("failed", "x402_bad_signature")
    assert chain.w3.eth.get_transaction_count(chain.relayer.address) == relayer_nonce
    assert agent.tier() == "free"


def test_a_node_outage_while_checking_leaves_no_pending_intent(chain: DevChain, agent: Agent) -> None:
    """The authorization is checked before the intent opens: a check the node cannot answer is a
    503 with nothing stored, not an intent nobody will pay."""
    agent.link()
    header = agent.signed_header(agent.quote())
    with chain.settings(CHAIN_RPC_URL=f"http://127.0.0.1:{free_port()}", CHAIN_RPC_TIMEOUT_SECONDS=2):
        down = agent.send(header)
    assert down.status_code == 503 and down.json()["error"]["code"] == "chain_unavailable", down.content
    assert not Payment.objects.exists()
    assert agent.send(header).status_code == 200  # the node back: the same authorization pays


def test_a_replayed_authorization_is_refused_and_pays_once(chain: DevChain, agent: Agent) -> None:
    agent.link()
    treasury_before = chain.balance(chain.treasury.address)
    header = agent.signed_header(agent.quote())
    first = agent.send(header)
    assert first.status_code == 200 and first.json()["status"] == "pending_verification", first.content

    replayed = agent.send(header)
    assert replayed.status_code == 422, replayed.content
    assert replayed.json()["error"]["fields"]["reason"] == ["nonce_used"]
    # Another organization that linked the same wallet cannot reuse it either.
    other = Agent(chain, agent.wallet)
    other.link()
    assert other.send(header).json()["error"]["fields"]["reason"] == ["nonce_used"]

    chain.confirm()
    confirmed = agent.api.post("/api/v1/subscriptions/payments/confirm", {
        "payment_id": first.json()["payment_id"], "tx_hash": first.json()["tx_hash"]}, format="json").json()
    assert confirmed["status"] == "confirmed"
    assert chain.balance(chain.treasury.address) == treasury_before + CORE  # one transfer only
    assert agent.tier() == "core" and other.tier() == "free"
    assert Payment.objects.filter(status="confirmed").count() == 1
    assert set(Payment.objects.filter(status="failed").values_list("failure_reason", flat=True)) == {
        "x402_nonce_used"}


def test_who_may_pay_and_when_x402_is_offered(chain: DevChain, agent: Agent) -> None:
    # Each check answers before any quote (rate limit: 5 upgrade requests a minute per IP).
    # A key bound to one stack of a school reads the plan but does not pay; nor does a read-only key.
    school = make_org(tier="free")
    _, stack_secret = make_key(school, stack=make_stack(school, "pupil"))
    _, read_only_secret = make_key(school, read_only=True)
    for secret in (stack_secret, read_only_secret):
        response = bearer_client(secret).post(UPGRADE, {"tier": "core", "pay_with": "x402"}, format="json")
        assert response.status_code == 403 and response.json()["error"]["code"] == "billing_manager_required"
    # Not an upgrade, or no relayer to settle with: refused before the 402.
    assert agent.api.post(UPGRADE, {"tier": "free", "pay_with": "x402"}, format="json").status_code == 400
    with chain.settings(CHAIN_RELAYER_KEY=""):
        response = agent.api.post(UPGRADE, {"tier": "core", "pay_with": "x402"}, format="json")
        assert response.status_code == 503 and response.json()["error"]["code"] == "billing_unavailable"
    assert not Payment.objects.exists()


def test_a_malformed_header_or_an_unlinked_wallet_stores_and_sends_nothing(chain: DevChain, agent: Agent) -> None:
    assert agent.api.post(UPGRADE, {"tier": "core", "pay_with": "card"}, format="json").status_code == 400
    bad = agent.send("not-base64!")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_payment", bad.content
    assert not Payment.objects.exists()
    # The wallet was never linked to the agent's account: refused before anything is submitted.
    relayer_nonce = chain.w3.eth.get_transaction_count(chain.relayer.address)
    refused = agent.send(agent.signed_header(agent.quote()))
    assert refused.status_code == 422 and refused.json()["error"]["fields"]["reason"] == ["sender_not_linked"]
    assert chain.w3.eth.get_transaction_count(chain.relayer.address) == relayer_nonce
    assert agent.tier() == "free" and not Payment.objects.exclude(status="failed").exists()
