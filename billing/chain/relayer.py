"""Submitting a checked x402 authorization from our relayer account (the package docstring has
the overview; docs/billing.md §4).

The relayer account signs with consecutive nonces, so every web process takes its turn under one
PostgreSQL advisory lock keyed on the relayer's address, held from reading the nonce to sending
(`_relayer_turn`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import OperationalError, connection, transaction
from eth_account import Account
from hexbytes import HexBytes
from web3.exceptions import ContractLogicError, TimeExhausted, Web3RPCError

from billing.chain.node import TOKEN_ABI, call, chain_config, web3_client
from billing.chain.x402 import CheckedAuthorization, SettlementRefused, x402_check
from memoryhub.errors import ChainUnavailable

logger = logging.getLogger(__name__)

SETTLEMENT_RECEIPT_TIMEOUT_SECONDS = 30

# The x402 relayer's turn: a PostgreSQL advisory lock (namespace, hashtext(lowercase relayer
# address)), shared by every web process and thread on the database ("MH" in the high half; other
# namespaces: memories/changes/publish.py, memories/lifecycle/jobs.py). A settlement waits this long for
# its turn, then answers 503 chain_unavailable with Retry-After rather than hold the request.
RELAYER_LOCK_NAMESPACE = 0x4D480011
RELAYER_LOCK_WAIT_SECONDS = 30
_LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE of a lock wait that ran into lock_timeout


def x402_submit(checked: CheckedAuthorization) -> str:
    """Submit a checked authorization from our relayer account; the transaction hash (0x
    lowercase). The token itself may still refuse it (simulated before sending: SettlementRefused
    `rejected_by_token`); the returned transaction still goes through inspect_transfer like a
    pasted hash."""
    config = chain_config()
    w3 = web3_client(config)
    auth, raw_signature = checked.authorization, checked.signature
    token = w3.eth.contract(address=config.usdc_contract, abi=TOKEN_ABI)
    relayer = Account.from_key(config.relayer_key)
    transfer = token.functions.transferWithAuthorization(
        auth.sender, auth.recipient, auth.value, auth.valid_after, auth.valid_before, auth.nonce,
        raw_signature[64] if raw_signature[64] >= 27 else raw_signature[64] + 27,
        raw_signature[:32], raw_signature[32:64])
    # One relayer account signs with consecutive nonces: one settlement at a time across processes.
    with _relayer_turn(relayer.address):
        try:
            tx = call(lambda: transfer.build_transaction({
                "from": relayer.address, "chainId": config.chain_id,
                "nonce": w3.eth.get_transaction_count(relayer.address, "pending")}))
        except ContractLogicError as exc:  # the token itself refuses (simulated before sending)
            raise SettlementRefused("rejected_by_token", "The token contract refused the authorization.") from exc
        signed = relayer.sign_transaction(tx)
        sent = call(lambda: w3.eth.send_raw_transaction(signed.raw_transaction))
    tx_hash = HexBytes(sent).to_0x_hex()
    # Submitted (and the relayer's turn over): wait briefly for its block; if it takes longer,
    # inspect_transfer says "pending".
    with contextlib.suppress(TimeExhausted, Web3RPCError, OSError):
        w3.eth.wait_for_transaction_receipt(sent, timeout=SETTLEMENT_RECEIPT_TIMEOUT_SECONDS, poll_latency=0.2)
    return tx_hash


def settle_transfer_with_authorization(authorization: dict[str, Any], signature: str, *, expected_amount: int,
                                       expected_from: Iterable[str]) -> str:
    """Check an x402 `exact` authorization completely, then submit it from our relayer account
    (x402_check, then x402_submit); the transaction hash (0x lowercase)."""
    return x402_submit(x402_check(authorization, signature, expected_amount=expected_amount,
                                  expected_from=expected_from))


@contextmanager
def _relayer_turn(relayer_address: str) -> Iterator[None]:
    """Hold the relayer's advisory lock for the block: from reading its pending nonce to handing
    the signed transaction to the node, no other settlement (in this or any other process) signs
    with that account, so two never take the same nonce. A transaction-level lock: it is released
    when the block's transaction ends, even if the process dies mid-way (the database drops the
    session's locks). Called outside a transaction (a web request in autocommit), the block is its
    own short transaction; inside one, the lock lasts until that one ends.

    The wait is bounded by a local lock_timeout: a turn that does not come within
    RELAYER_LOCK_WAIT_SECONDS is ChainUnavailable (503, retry), never a hung request."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        row = cursor.fetchone()
        previous = str(row[0]) if row else "0"
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{RELAYER_LOCK_WAIT_SECONDS * 1000}ms"])
        try:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                           [RELAYER_LOCK_NAMESPACE, relayer_address.lower()])
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                raise
            logger.warning("x402 relayer busy: no turn within %s s", RELAYER_LOCK_WAIT_SECONDS)
            raise ChainUnavailable("Another payment is being submitted; retry shortly.",
                                   code="relayer_busy") from None
        # The timeout was for this wait only; the rest of the transaction keeps its own.
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])
        yield
