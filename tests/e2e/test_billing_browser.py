"""The billing page in real Chromium with a browser wallet: an EIP-1193 provider injected into the
page whose `request` is answered in Python by an Anvil account (eth_account signs; raw transactions
go to the session's real Anvil node). A billing user connects the wallet (SIWE), pays for core
with it (an ERC-20 transfer through eth_sendTransaction, then confirmed by hash), blocks are
mined, and the page shows the new plan."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import encode_defunct

from accounts.models import Membership, Organization
from billing.models import Wallet
from tests.billing.chain import DevChain
from tests.billing.conftest import chain, dev_chain_node  # noqa: F401 - the chain fixtures
from tests.billing.test_payments import now_on_chain
from tests.e2e.browser import WatchedPage, check_page, sign_in
from tests.factories import make_org, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"  # tests/factories.make_user's default

# window.ethereum for the page: every request goes to the Python side (page.expose_function).
PROVIDER = """
window.ethereum = {
  isMetaMask: false,
  request: async function (args) {
    const answer = JSON.parse(await window.__anvilWallet(args.method, JSON.stringify(args.params || [])));
    if (answer.error) throw new Error(answer.error);
    return answer.result;
  },
};
"""


def anvil_wallet(node: DevChain, key: str) -> Callable[[str, str], str]:
    """The wallet behind the injected provider: one Anvil account, signing locally."""
    account = Account.from_key(key)
    w3 = node.w3

    def request(method: str, params_json: str) -> str:
        params: list[Any] = json.loads(params_json)
        try:
            if method in ("eth_requestAccounts", "eth_accounts"):
                result: Any = [account.address.lower()]  # as wallets answer: not EIP-55
            elif method == "eth_chainId":
                result = hex(w3.eth.chain_id)
            elif method == "personal_sign":
                result = account.sign_message(encode_defunct(text=params[0])).signature.to_0x_hex()
            elif method == "eth_sendTransaction":
                call = params[0]
                now_on_chain(node)
                signed = account.sign_transaction({
                    "to": w3.to_checksum_address(call["to"]), "data": call["data"], "value": int(call["value"], 16),
                    "gas": 100_000, "gasPrice": w3.eth.gas_price, "chainId": w3.eth.chain_id,
                    "nonce": w3.eth.get_transaction_count(account.address)})
                sent = w3.eth.send_raw_transaction(signed.raw_transaction)
                w3.eth.wait_for_transaction_receipt(sent, timeout=10)
                result = sent.to_0x_hex()
            else:
                return json.dumps({"error": f"unsupported method {method}"})
        except Exception as error:  # handed to the page as the wallet's refusal, as a wallet does
            return json.dumps({"error": str(error)})
        return json.dumps({"result": result})

    return request


def test_connect_a_wallet_pay_with_it_and_see_the_plan_change(
        open_page: Callable[[], WatchedPage], dashboard_url: str, chain: DevChain) -> None:  # noqa: F811
    started = time.monotonic()
    org = make_org(tier="free")
    user = make_user(org, role=Membership.Role.BILLING, email="bursar@school.example", username="")
    wallet = chain.accounts[9]
    watched = open_page()
    page = watched.page
    page.expose_function("__anvilWallet", anvil_wallet(chain, wallet.key))
    page.add_init_script(PROVIDER)
    sign_in(watched, dashboard_url, user.email, PASSWORD, expect_path="/dashboard/billing/")
    check_page(watched, "billing-free")

    page.get_by_role("button", name="Connect wallet").click()
    page.wait_for_selector(f'[data-wallet="{wallet.address}"]')
    assert Wallet.objects.filter(organization=org, address=wallet.address).exists()
    check_page(watched, "wallet-linked")

    page.get_by_role("button", name="Pay for an upgrade").click()
    page.wait_for_load_state("load")
    assert "/dashboard/billing/payments/pay_" in page.url
    check_page(watched, "pay")
    page.get_by_role("button", name="Pay with connected wallet").click()
    page.wait_for_selector("#payment-status >> text=pending verification")
    assert Organization.objects.get(pk=org.pk).tier == "free"

    chain.confirm()
    page.get_by_role("button", name="Check the transfer").click()
    page.wait_for_selector("text=Payment confirmed: core is active.")
    watched.goto(f"{dashboard_url}/dashboard/billing/")
    assert page.locator("#plan-name").inner_text() == "Core"
    check_page(watched, "billing-core")
    assert Organization.objects.get(pk=org.pk).tier == "core"
    assert time.monotonic() - started < 40
