"""billing/chain/ against a real EVM (Anvil) and the real compiled TestUSDC.

Every refusal a forger could try is checked with a real transaction: a look-alike token, the
wrong recipient, an amount one base unit off, a reverted transaction, too few confirmations, an
unknown hash, another chain, a transfer older than the intent, a sender that is not linked; a
reorg (snapshot/revert) that removes a transfer; the treasury watcher over bounded log ranges;
x402 settlement with the x402 package's own client, a tampered signature, a replayed nonce, an
authorization signed for another chain or a look-alike token; and the relayer's turn, a Postgres
advisory lock: a settlement waits for another process holding it, concurrent settlements (threads,
and separate processes) each get their own relayer nonce.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import connection
from eth_account import Account
from x402 import x402ClientSync
from x402.http import x402HTTPClientSync
from x402.mechanisms.evm import EthAccountSigner
from x402.mechanisms.evm.exact import register_exact_evm_client

from billing.chain import node as chain_node
from billing.chain import relayer as chain_relayer
from billing.chain import transfers as chain_transfers
from billing.chain import x402 as chain_x402
from memoryhub.embedded import free_port
from memoryhub.errors import BillingUnavailable, ChainUnavailable, InvalidInput, api_exception_handler
from tests.billing.chain import USDC, DevChain
from tests.factories import other_connection

# x402 settlement takes the relayer's turn (a Postgres advisory lock), so these tests use the database.
pytestmark = pytest.mark.django_db

BASE_DIR = Path(__file__).resolve().parents[2]
PRICE = 5 * USDC  # the core tier: 5 USDC = 5,000,000 base units


def pay(chain: DevChain, payer_index: int = 0, amount: int = PRICE, **kwargs: object) -> str:
    return chain.send_usdc(chain.accounts[payer_index], chain.treasury.address, amount, **kwargs)  # type: ignore[arg-type]


def inspect(chain: DevChain, tx_hash: str, *, payer_index: int = 0, amount: int = PRICE,
            not_before: object = None) -> chain_transfers.TransferCheck:
    before = not_before if not_before is not None else chain.block_time(0)
    return chain_transfers.inspect_transfer(tx_hash, expected_amount=amount,
                                            expected_from={chain.accounts[payer_index].address.lower()},
                                            not_before=before)  # type: ignore[arg-type]


def test_a_correct_transfer_is_pending_until_final_then_confirmed(chain: DevChain) -> None:
    payer = chain.accounts[0]
    tx_hash = pay(chain)
    check = inspect(chain, tx_hash)
    assert (check.status, check.reason, check.confirmations) == ("pending", "awaiting_confirmations", 1)
    chain.mine(chain.confirmations - 2)
    assert inspect(chain, tx_hash).status == "pending"  # one short
    chain.mine(1)
    check = inspect(chain, tx_hash)
    assert (check.status, check.reason) == ("confirmed", None)
    assert check.confirmations == chain.confirmations
    assert (check.sender, check.recipient, check.amount) == (payer.address, chain.treasury.address, PRICE)
    assert check.chain_id == 31337 and check.tx_hash == tx_hash and check.log_index == 0
    assert check.block_hash and check.block_number and check.block_time is not None
    assert check.message == "The transfer is confirmed."


def test_a_look_alike_tokens_transfer_is_never_counted(chain: DevChain) -> None:
    tx_hash = pay(chain, token=chain.lookalike)  # same contract code, same Transfer event, same name
    chain.confirm()
    check = inspect(chain, tx_hash)
    assert (check.status, check.reason, check.amount) == ("failed", "wrong_token", None)


def test_usdc_sent_elsewhere_is_refused(chain: DevChain) -> None:
    tx_hash = chain.send_usdc(chain.accounts[0], chain.accounts[1].address, PRICE)
    chain.confirm()
    check = inspect(chain, tx_hash)
    assert (check.status, check.reason, check.recipient) == ("failed", "wrong_recipient", chain.accounts[1].address)


@pytest.mark.parametrize("amount", [PRICE - 1, PRICE + 1])
def test_the_amount_must_be_exact_to_the_base_unit(chain: DevChain, amount: int) -> None:
    tx_hash = pay(chain, amount=amount)
    chain.confirm()
    check = inspect(chain, tx_hash)
    assert (check.status, check.reason, check.amount) == ("failed", "wrong_amount", amount)


def test_a_reverted_transaction_is_refused(chain: DevChain) -> None:
    broke = chain.owner  # holds no USDC: its transfer reverts on chain, with a receipt
    tx_hash = chain.send_usdc(broke, chain.treasury.address, PRICE, gas=100_000)
    chain.confirm()
    check = chain_transfers.inspect_transfer(tx_hash, expected_amount=PRICE, expected_from={broke.address},
                                             not_before=chain.block_time(0))
    assert (check.status, check.reason) == ("failed", "reverted")


def test_an_unknown_hash_is_refused_and_a_malformed_one_is_invalid_input(chain: DevChain) -> None:
    check = inspect(chain, "0x" + "ab" * 32)
    assert (check.status, check.reason) == ("failed", "unknown_tx")
    with pytest.raises(InvalidInput) as excinfo:
        inspect(chain, "0x1234")
    assert excinfo.value.code == "invalid_tx_hash"


def test_a_transaction_not_yet_in_a_block_is_pending(chain: DevChain) -> None:
    chain.rpc("evm_setAutomine", False)
    try:
        tx_hash = chain.token().functions.transfer(chain.treasury.address, PRICE).transact(
            {"from": chain.accounts[0].address}).to_0x_hex()
        assert (inspect(chain, tx_hash).status, inspect(chain, tx_hash).reason) == ("pending", "not_mined")
        chain.mine(chain.confirmations)
        assert inspect(chain, tx_hash).status == "confirmed"
    finally:
        chain.rpc("evm_setAutomine", True)


def test_a_node_on_another_chain_than_configured_is_refused(chain: DevChain) -> None:
    tx_hash = pay(chain)
    chain.confirm()
    with chain.settings(CHAIN_ID=8453):  # configured for Base, pointed at the dev chain
        check = inspect(chain, tx_hash)
    assert (check.status, check.reason, check.chain_id) == ("failed", "wrong_chain", 8453)


def test_a_transfer_from_before_the_intent_is_refused(chain: DevChain) -> None:
    tx_hash = pay(chain)
    chain.confirm()
    mined_at = chain.block_time(chain.head() - chain.confirmations + 1)
    assert inspect(chain, tx_hash, not_before=mined_at + timedelta(seconds=1)).reason == "before_intent"
    # An intent created within the block's second does not refuse it (block times are whole seconds).
    assert inspect(chain, tx_hash, not_before=mined_at + timedelta(milliseconds=900)).status == "confirmed"


def test_a_sender_that_is_not_a_linked_wallet_is_refused(chain: DevChain) -> None:
    tx_hash = pay(chain, payer_index=1)  # somebody else paid exactly the right amount
    chain.confirm()
    check = inspect(chain, tx_hash, payer_index=0)
    assert (check.status, check.reason, check.sender) == ("failed", "sender_not_linked", chain.accounts[1].address)
    nobody = chain_transfers.inspect_transfer(tx_hash, expected_amount=PRICE, expected_from=set(),
                                              not_before=chain.block_time(0))
    assert nobody.reason == "sender_not_linked"


def test_a_reorg_removes_a_transfer_before_it_is_final(chain: DevChain) -> None:
    before = chain.snapshot()
    tx_hash = pay(chain)
    chain.mine(3)
    seen = inspect(chain, tx_hash)
    assert seen.status == "pending" and seen.block_hash
    assert chain_transfers.still_canonical(tx_hash, seen.block_hash)
    chain.revert(before)  # the blocks holding the transfer are replaced by others
    chain.mine(chain.confirmations)
    assert not chain_transfers.still_canonical(tx_hash, seen.block_hash)
    assert inspect(chain, tx_hash).reason == "unknown_tx"


def test_treasury_transfers_finds_every_transfer_across_bounded_ranges(chain: DevChain) -> None:
    start = chain.head() + 1
    sent = []
    for i in range(12):
        sent.append((pay(chain, payer_index=i % 4, amount=PRICE + i), chain.accounts[i % 4].address, PRICE + i))
        chain.send_usdc(chain.accounts[0], chain.accounts[1].address, PRICE)  # not to the treasury
        pay(chain, token=chain.lookalike)  # not USDC
        chain.mine(i % 3)
    end = chain.head()
    with chain.settings(CHAIN_LOG_RANGE=5):  # many small eth_getLogs ranges, boundaries everywhere
        found = chain_transfers.treasury_transfers(start, end)
    assert [(t.tx_hash, t.sender, t.amount) for t in found] == sent
    assert all(t.recipient == chain.treasury.address and t.block_hash.startswith("0x") for t in found)
    assert [t.block_number for t in found] == sorted(t.block_number for t in found)
    assert chain_transfers.treasury_transfers(end + 1, end + 1) == []
    with pytest.raises(InvalidInput):
        chain_transfers.treasury_transfers(end, start)


def test_payments_fail_closed_without_a_treasury(chain: DevChain) -> None:
    tx_hash = pay(chain)
    with chain.settings(TREASURY_ADDRESS=""), pytest.raises(BillingUnavailable) as excinfo:
        inspect(chain, tx_hash)
    response = api_exception_handler(excinfo.value, {})
    assert response.status_code == 503 and response.data["error"]["code"] == "billing_unavailable"
    with chain.settings(CHAIN_RPC_URL=""), pytest.raises(BillingUnavailable):
        chain_node.head_block()


def test_an_unreachable_node_is_503_with_retry_after(chain: DevChain) -> None:
    with chain.settings(CHAIN_RPC_URL=f"http://127.0.0.1:{free_port()}", CHAIN_RPC_TIMEOUT_SECONDS=2):
        with pytest.raises(ChainUnavailable) as excinfo:
            inspect(chain, "0x" + "ab" * 32)
        with pytest.raises(ChainUnavailable):
            chain_transfers.treasury_transfers(0, 10)
    response = api_exception_handler(excinfo.value, {})
    assert response.status_code == 503 and int(response["Retry-After"]) >= 1
    assert response.data["error"]["code"] == "chain_unavailable"


# ---------------------------------------------------------------------------------------------
# x402


def agent_payment_header(chain: DevChain, key: str, amount: int = PRICE, *, max_timeout_seconds: int = 600) -> str:
    """What an agent does with PyPI x402's own client when our upgrade route answers 402."""
    url = "http://testserver/api/v1/subscriptions/upgrade"
    body, header = chain_x402.x402_payment_required(amount, resource_url=url, description="MemoryHub core",
                                                    max_timeout_seconds=max_timeout_seconds)
    # On Base the client knows USDC already; the development token must be allowed explicitly.
    client = x402ClientSync().set_spend_controls(
        {"allowed_assets": [{"network": "eip155:31337", "asset": chain.usdc, "max_amount_per_payment": str(amount)}]})
    register_exact_evm_client(client, EthAccountSigner(Account.from_key(key)))
    headers, _ = x402HTTPClientSync(client).handle_402_response(
        {"PAYMENT-REQUIRED": header}, json.dumps(body).encode(), url)
    return str(headers["PAYMENT-SIGNATURE"])


def settle(chain: DevChain, payment: chain_x402.X402Payment, *, payer_index: int = 0,
           amount: int = PRICE) -> str:
    return chain_relayer.settle_transfer_with_authorization(
        payment.authorization, payment.signature, expected_amount=amount,
        expected_from={chain.accounts[payer_index].address})


def test_an_agent_pays_over_x402_without_holding_gas(chain: DevChain) -> None:
    agent = chain.accounts[0]
    eth_before = chain.w3.eth.get_balance(agent.address)
    treasury_before = chain.balance(chain.treasury.address)
    payment = chain_x402.x402_decode_payment(agent_payment_header(chain, agent.key))
    assert payment.payer == agent.address
    tx_hash = settle(chain, payment)
    assert inspect(chain, tx_hash).status == "pending"
    chain.confirm()
    check = inspect(chain, tx_hash)
    assert (check.status, check.sender, check.amount) == ("confirmed", agent.address, PRICE)
    assert chain.balance(chain.treasury.address) == treasury_before + PRICE
    assert chain.w3.eth.get_balance(agent.address) == eth_before  # our relayer paid the gas
    receipt = chain_x402.x402_settle_response_header(tx_hash, agent.address, PRICE)
    assert receipt  # base64 JSON the agent's client reads


def test_x402_replayed_authorization_is_refused(chain: DevChain) -> None:
    payment = chain_x402.x402_decode_payment(agent_payment_header(chain, chain.accounts[0].key))
    settle(chain, payment)
    with pytest.raises(chain_x402.SettlementRefused) as excinfo:
        settle(chain, payment)
    assert excinfo.value.reason == "nonce_used" and excinfo.value.status == 422


def test_x402_tampered_or_foreign_signatures_are_refused_before_anything_is_sent(chain: DevChain) -> None:
    relayer_nonce = chain.w3.eth.get_transaction_count(chain.relayer.address)
    payment = chain_x402.x402_decode_payment(agent_payment_header(chain, chain.accounts[0].key))
    longer = dict(payment.authorization, validBefore=str(int(payment.authorization["validBefore"]) + 3600))
    flipped = payment.signature[:-4] + ("00" if payment.signature[-4:-2] != "00" else "11") + payment.signature[-2:]
    # Signed by account 1, claiming to come from account 0 (whose wallet is linked).
    forged = chain_x402.x402_decode_payment(agent_payment_header(chain, chain.accounts[1].key))
    forged_auth = dict(forged.authorization, **{"from": chain.accounts[0].address})
    for authorization, signature in ((longer, payment.signature), (payment.authorization, flipped),
                                     (forged_auth, forged.signature)):
        with pytest.raises(chain_x402.SettlementRefused) as excinfo:
            chain_relayer.settle_transfer_with_authorization(
                authorization, signature, expected_amount=PRICE, expected_from={chain.accounts[0].address})
        assert excinfo.value.reason == "bad_signature"
    assert chain.w3.eth.get_transaction_count(chain.relayer.address) == relayer_nonce  # nothing submitted


def test_x402_checks_recipient_amount_payer_and_validity(chain: DevChain) -> None:
    payment = chain_x402.x402_decode_payment(agent_payment_header(chain, chain.accounts[0].key))
    with pytest.raises(chain_x402.SettlementRefused) as excinfo:
        settle(chain, payment, amount=PRICE + 1)
    assert excinfo.value.reason == "wrong_amount"
    with pytest.raises(chain_x402.SettlementRefused) as excinfo:
        settle(chain, payment, payer_index=1)
    assert excinfo.value.reason == "sender_not_linked"
    with pytest.raises(chain_x402.SettlementRefused) as excinfo:
        chain_relayer.settle_transfer_with_authorization(
            dict(payment.authorization, to=chain.accounts[2].address), payment.signature, expected_amount=PRICE,
            expected_from={chain.accounts[0].address})
    assert excinfo.value.reason == "wrong_recipient"
    # Signed, but valid for 10 s only: it could expire before a block includes it.
    header = agent_payment_header(chain, chain.accounts[0].key, max_timeout_seconds=10)
    short = chain_x402.x402_decode_payment(header)
    with pytest.raises(chain_x402.SettlementRefused) as excinfo:
        settle(chain, short)
    assert excinfo.value.reason == "expired"
    with pytest.raises(chain_x402.SettlementRefused) as excinfo:
        chain_relayer.settle_transfer_with_authorization({"from": "nope"}, "0x00", expected_amount=PRICE,
                                                         expected_from={chain.accounts[0].address})
    assert excinfo.value.reason == "malformed"
    for garbage in ("not base64!", "eyJ4NDAyVmVyc2lvbiI6IDJ9"):  # the second is {"x402Version": 2}
        with pytest.raises(InvalidInput):
            chain_x402.x402_decode_payment(garbage)


def test_x402_payer_without_enough_usdc_is_refused(chain: DevChain) -> None:
    broke = chain.owner
    payment = chain_x402.x402_decode_payment(agent_payment_header(chain, broke.key))
    with pytest.raises(chain_x402.SettlementRefused) as excinfo:
        chain_relayer.settle_transfer_with_authorization(payment.authorization, payment.signature,
                                                         expected_amount=PRICE, expected_from={broke.address})
    assert excinfo.value.reason == "insufficient_funds"


def test_x402_authorization_not_valid_yet_is_refused(chain: DevChain) -> None:
    """Signed directly with eth_account (the x402 client always starts validity at 0)."""
    from eth_account.messages import encode_typed_data

    payer = chain.accounts[0]
    now = int(chain.block_time(chain.head()).timestamp())
    authorization = {"from": payer.address, "to": chain.treasury.address, "value": str(PRICE),
                     "validAfter": str(now + 3600), "validBefore": str(now + 7200), "nonce": "0x" + "07" * 32}
    typed = {"types": chain_x402._AUTHORIZATION_TYPES, "primaryType": "TransferWithAuthorization",
             "domain": {"name": "USD Coin (MemoryHub dev)", "version": "2", "chainId": 31337,
                        "verifyingContract": chain.usdc},
             "message": {**{k: int(v) for k, v in authorization.items() if k in ("value", "validAfter", "validBefore")},
                         "from": payer.address, "to": chain.treasury.address, "nonce": bytes.fromhex("07" * 32)}}
    signature = Account.sign_message(encode_typed_data(full_message=typed), payer.key).signature.to_0x_hex()
    with pytest.raises(chain_x402.SettlementRefused) as excinfo:
        chain_relayer.settle_transfer_with_authorization(authorization, signature, expected_amount=PRICE,
                                                         expected_from={payer.address})
    assert excinfo.value.reason == "not_yet_valid"


def test_x402_authorizations_signed_for_another_chain_or_a_look_alike_token_are_refused(chain: DevChain) -> None:
    """EIP-712 binds the signature to a chain id and a token contract: signed for Base, or for the
    look-alike token's domain, it is not an authorization for our USDC here (the token would refuse
    it too). Refused before anything is sent; a payload naming another network is not even read."""
    from eth_account.messages import encode_typed_data

    payer = chain.accounts[0]
    relayer_nonce = chain.w3.eth.get_transaction_count(chain.relayer.address)
    now = int(chain.block_time(chain.head()).timestamp())
    authorization = {"from": payer.address, "to": chain.treasury.address, "value": str(PRICE),
                     "validAfter": "0", "validBefore": str(now + 3600), "nonce": "0x" + "09" * 32}
    message = {"from": payer.address, "to": chain.treasury.address, "value": PRICE, "validAfter": 0,
               "validBefore": now + 3600, "nonce": bytes.fromhex("09" * 32)}
    domains = {
        "another chain": {"name": "USD Coin (MemoryHub dev)", "version": "2", "chainId": 8453,
                          "verifyingContract": chain.usdc},
        "look-alike token": {"name": "USD Coin", "version": "2", "chainId": 31337,
                             "verifyingContract": chain.lookalike},
    }
    for label, domain in domains.items():
        typed = {"types": chain_x402._AUTHORIZATION_TYPES, "primaryType": "TransferWithAuthorization",
                 "domain": domain, "message": message}
        signature = Account.sign_message(encode_typed_data(full_message=typed), payer.key).signature.to_0x_hex()
        with pytest.raises(chain_x402.SettlementRefused) as excinfo:
            chain_relayer.settle_transfer_with_authorization(authorization, signature, expected_amount=PRICE,
                                                             expected_from={payer.address})
        assert excinfo.value.reason == "bad_signature", label
    assert chain.w3.eth.get_transaction_count(chain.relayer.address) == relayer_nonce
    header = agent_payment_header(chain, payer.key)
    payload = json.loads(base64.b64decode(header))
    payload["accepted"]["network"] = "eip155:8453"
    with pytest.raises(InvalidInput) as invalid:
        chain_x402.x402_decode_payment(base64.b64encode(json.dumps(payload).encode()).decode())
    assert invalid.value.code == "invalid_payment"


# ---------------------------------------------------------------------------------------------
# The relayer's turn: one settlement at a time per relayer account, across processes


def _hold_relayer_lock_elsewhere(chain: DevChain) -> Any:
    """Another web process in the middle of a settlement: its own database session holds the lock."""
    other = other_connection(autocommit=True)
    other.execute("SELECT pg_advisory_lock(%s, hashtext(%s))",
                  [chain_relayer.RELAYER_LOCK_NAMESPACE, chain.relayer.address.lower()])
    return other


@pytest.mark.django_db(transaction=True)
def test_a_settlement_waits_while_another_process_holds_the_relayers_turn(
        chain: DevChain, monkeypatch: pytest.MonkeyPatch) -> None:
    payment = chain_x402.x402_decode_payment(agent_payment_header(chain, chain.accounts[0].key))
    relayer_nonce = chain.w3.eth.get_transaction_count(chain.relayer.address)
    settled: list[str] = []

    def settle_in_thread() -> None:
        try:
            settled.append(settle(chain, payment))
        finally:
            connection.close()

    thread = threading.Thread(target=settle_in_thread)
    other = _hold_relayer_lock_elsewhere(chain)
    try:
        # No turn within the wait: a clear 503 (retry), nothing sent.
        monkeypatch.setattr(chain_relayer, "RELAYER_LOCK_WAIT_SECONDS", 1)
        with pytest.raises(ChainUnavailable) as excinfo:
            settle(chain, payment)
        assert (excinfo.value.code, excinfo.value.status) == ("relayer_busy", 503)
        assert chain.w3.eth.get_transaction_count(chain.relayer.address) == relayer_nonce
        # With the usual wait it waits, sending nothing while the other process has the turn...
        monkeypatch.setattr(chain_relayer, "RELAYER_LOCK_WAIT_SECONDS", 30)
        thread.start()
        thread.join(timeout=2)
        assert thread.is_alive() and not settled
        assert chain.w3.eth.get_transaction_count(chain.relayer.address) == relayer_nonce
    finally:
        # Unlock before closing: the server may drop a closed client's locks only later.
        other.execute("SELECT pg_advisory_unlock_all()")
        other.close()
    # ...and settles as soon as the turn is free.
    thread.join(timeout=30)
    assert len(settled) == 1 and chain.w3.eth.get_transaction_receipt(settled[0])["status"] == 1
    assert chain.w3.eth.get_transaction_count(chain.relayer.address) == relayer_nonce + 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_settlements_each_take_their_own_relayer_nonce(chain: DevChain) -> None:
    """Four payers settle at once from four threads (each its own database session), and the first
    payer's authorization is sent twice: four transfers, four consecutive relayer nonces, one refusal."""
    payments = [chain_x402.x402_decode_payment(agent_payment_header(chain, chain.accounts[i].key))
                for i in range(4)]
    jobs = [(payment, i) for i, payment in enumerate(payments)] + [(payments[0], 0)]
    relayer_nonce = chain.w3.eth.get_transaction_count(chain.relayer.address)
    treasury_before = chain.balance(chain.treasury.address)
    start = threading.Barrier(len(jobs))
    outcomes: list[str | None] = [None] * len(jobs)

    def attempt(n: int, payment: chain_x402.X402Payment, payer_index: int) -> None:
        try:
            start.wait(timeout=30)
            outcomes[n] = settle(chain, payment, payer_index=payer_index)
        except chain_x402.SettlementRefused as refused:
            outcomes[n] = refused.reason
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt, args=(n, *job)) for n, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    hashes = [o for o in outcomes if o and o.startswith("0x")]
    assert len(hashes) == 4, outcomes
    # The authorization sent twice paid once; the other copy was refused (checked, or by the token).
    assert sorted(o for o in (outcomes[0], outcomes[4]) if o and not o.startswith("0x")) in (
        ["nonce_used"], ["rejected_by_token"]), outcomes
    nonces = sorted(int(chain.w3.eth.get_transaction(h)["nonce"]) for h in hashes)
    assert nonces == list(range(relayer_nonce, relayer_nonce + 4))
    assert all(chain.w3.eth.get_transaction_receipt(h)["status"] == 1 for h in hashes)
    assert chain.balance(chain.treasury.address) == treasury_before + 4 * PRICE


SETTLE_SCRIPT = """
import json, sys
import django
django.setup()
from billing.chain import relayer
jobs = json.loads(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()  # the test's go: both processes start settling together
hashes = [relayer.settle_transfer_with_authorization(job["authorization"], job["signature"],
                                                     expected_amount=job["amount"], expected_from=[job["payer"]])
          for job in jobs]
print(json.dumps(hashes), flush=True)
"""


@pytest.mark.django_db(transaction=True)
def test_two_web_processes_settling_at_once_never_share_a_relayer_nonce(chain: DevChain) -> None:
    """Two real processes (as two web workers), each settling four payers' authorizations back to
    back, released together: eight transfers, eight distinct relayer nonces, none refused or lost."""
    database = urlsplit(os.environ["DATABASE_URL"])
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "memoryhub.settings",
           # The session's test database (the URL names the one it was made from).
           "DATABASE_URL": urlunsplit(database._replace(path="/" + settings.DATABASES["default"]["NAME"])),
           "CHAIN_RPC_URL": chain.rpc_url, "CHAIN_ID": "31337", "USDC_CONTRACT": chain.usdc,
           "TREASURY_ADDRESS": chain.treasury.address, "CHAIN_RELAYER_KEY": chain.relayer.key,
           "PAYMENT_CONFIRMATIONS": str(chain.confirmations)}
    batches = []
    for first in (0, 4):
        batch = []
        for i in range(first, first + 4):
            payment = chain_x402.x402_decode_payment(agent_payment_header(chain, chain.accounts[i].key))
            batch.append({"authorization": payment.authorization, "signature": payment.signature,
                          "amount": PRICE, "payer": payment.payer})
        batches.append(batch)
    relayer_nonce = chain.w3.eth.get_transaction_count(chain.relayer.address)
    processes = [subprocess.Popen([sys.executable, "-c", SETTLE_SCRIPT, json.dumps(batch)], cwd=BASE_DIR, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for batch in batches]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready", process.stderr
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        results = [process.communicate(timeout=120) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, (_, err) in zip(processes, results, strict=True):
        assert process.returncode == 0, err[-2000:]
    hashes = [h for out, _ in results for h in json.loads(out.strip().splitlines()[-1])]
    assert len(set(hashes)) == 8
    nonces = sorted(int(chain.w3.eth.get_transaction(h)["nonce"]) for h in hashes)
    assert nonces == list(range(relayer_nonce, relayer_nonce + 8))
    assert all(chain.w3.eth.get_transaction_receipt(h)["status"] == 1 for h in hashes)
