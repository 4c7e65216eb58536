"""Whether one transaction pays an intent, and the treasury's incoming USDC transfers (the
package docstring has the overview; docs/billing.md §3).

A transfer counts only when everything here agrees: the receipt succeeded, a `Transfer` log was
emitted by the configured USDC contract (a look-alike token's identical log is ignored), to the
configured treasury, of exactly the expected base units, from one of the paying organization's
linked wallets, in a block after the intent was created, on the configured chain, with at least
PAYMENT_CONFIRMATIONS confirmations ("pending" until then).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache, partial
from typing import Any, Literal

from eth_utils import to_checksum_address
from hexbytes import HexBytes
from web3 import Web3
from web3.exceptions import TransactionNotFound
from web3.types import RPCEndpoint

from billing.chain.node import ADDRESS, TRANSFER_TOPIC, call, chain_config, node_chain_id, web3_client
from memoryhub.errors import ChainUnavailable, InvalidInput

logger = logging.getLogger(__name__)

_TX_HASH = re.compile(r"0x[0-9a-fA-F]{64}")

Status = Literal["confirmed", "pending", "failed"]

REASON_MESSAGES = {
    None: "The transfer is confirmed.",
    "not_mined": "The transaction is known but not yet in a block; try again shortly.",
    "awaiting_confirmations": "The transfer is in a block but not yet final; waiting for more confirmations.",
    "unknown_tx": "No transaction with this hash exists on the payment chain.",
    "reverted": "The transaction failed on chain (reverted); nothing was transferred.",
    "wrong_token": "The transaction moved no USDC (only the configured USDC contract counts).",
    "wrong_recipient": "The USDC in this transaction did not go to the treasury address.",
    "wrong_amount": "The USDC sent to the treasury is not exactly the amount due.",
    "sender_not_linked": "The USDC was sent from a wallet that is not linked to this organization.",
    "before_intent": "The transfer happened before this payment was requested.",
    "wrong_chain": "The payment node is on another chain than the one configured.",
}



@dataclass(frozen=True)
class TransferCheck:
    status: Status
    reason: str | None
    chain_id: int
    tx_hash: str
    confirmations: int = 0
    log_index: int | None = None
    sender: str | None = None
    recipient: str | None = None
    amount: int | None = None
    block_number: int | None = None
    block_hash: str | None = None
    block_time: datetime | None = None

    @property
    def message(self) -> str:
        return REASON_MESSAGES.get(self.reason, "The transfer cannot be accepted.")


@dataclass(frozen=True)
class _Transfer:
    log_index: int
    sender: str
    recipient: str
    amount: int


def _word_address(topic: bytes) -> str:
    return _checksummed(bytes(topic)[-20:].hex())


@lru_cache(maxsize=65_536)
def _checksummed(address_hex: str) -> str:
    """EIP-55 needs a keccak per address; the treasury sees the same payers again and again, and
    hashing them dominated a large treasury scan (bench/payments.py)."""
    return str(to_checksum_address("0x" + address_hex))


def _usdc_transfers(logs: Iterable[Any], usdc: str) -> list[_Transfer]:
    """The ERC-20 Transfer logs emitted by the USDC contract itself."""
    found: list[_Transfer] = []
    for entry in logs:
        topics = [HexBytes(t) for t in entry["topics"]]
        if len(topics) != 3 or topics[0] != HexBytes(TRANSFER_TOPIC) or len(HexBytes(entry["data"])) != 32:
            continue  # not an ERC-20 Transfer (ERC-721's has the amount as a fourth topic)
        if to_checksum_address(entry["address"]) != usdc:
            continue  # a look-alike token's log: same event, same fields, not money
        found.append(_Transfer(int(entry["logIndex"]), _word_address(topics[1]), _word_address(topics[2]),
                               int.from_bytes(HexBytes(entry["data"]), "big")))
    return found


def normalize_tx_hash(tx_hash: str) -> str:
    if not isinstance(tx_hash, str) or not _TX_HASH.fullmatch(tx_hash):
        raise InvalidInput("tx_hash must be 0x followed by 64 hexadecimal characters.", code="invalid_tx_hash",
                           fields={"tx_hash": ["Expected 0x followed by 64 hexadecimal characters."]})
    return tx_hash.lower()


def addresses(values: Iterable[str]) -> frozenset[str]:
    return frozenset(to_checksum_address(v) for v in values if isinstance(v, str) and ADDRESS.fullmatch(v))


def inspect_transfer(tx_hash: str, *, expected_amount: int, expected_from: Iterable[str],
                     not_before: datetime, confirmations: int | None = None) -> TransferCheck:
    """Does transaction `tx_hash` pay exactly `expected_amount` USDC base units into the treasury
    from one of `expected_from`, after `not_before`? See the module docstring for every rule."""
    config = chain_config()
    tx_hash = normalize_tx_hash(tx_hash)
    linked = addresses(expected_from)
    required = config.confirmations if confirmations is None else confirmations
    w3 = web3_client(config)

    def result(status: Status, reason: str | None, **fields: Any) -> TransferCheck:
        return TransferCheck(status=status, reason=reason, chain_id=config.chain_id, tx_hash=tx_hash, **fields)

    if node_chain_id(config, w3) != config.chain_id:
        return result("failed", "wrong_chain")
    try:
        receipt = call(lambda: w3.eth.get_transaction_receipt(HexBytes(tx_hash)))
    except TransactionNotFound:
        try:
            call(lambda: w3.eth.get_transaction(HexBytes(tx_hash)))
        except TransactionNotFound:
            return result("failed", "unknown_tx")
        return result("pending", "not_mined")
    block_number = int(receipt["blockNumber"])
    block_hash = HexBytes(receipt["blockHash"]).to_0x_hex()
    block = {"block_number": block_number, "block_hash": block_hash}
    if int(receipt["status"]) != 1:
        return result("failed", "reverted", **block)

    transfers = _usdc_transfers(receipt["logs"], config.usdc_contract)
    if not transfers:
        return result("failed", "wrong_token", **block)
    to_treasury = [t for t in transfers if t.recipient == config.treasury]
    if not to_treasury:
        return result("failed", "wrong_recipient", **block, **_fields(transfers[0]))
    exact = [t for t in to_treasury if t.amount == expected_amount]
    if not exact:
        return result("failed", "wrong_amount", **block, **_fields(to_treasury[0]))
    mine = [t for t in exact if t.sender in linked]
    if not mine:
        return result("failed", "sender_not_linked", **block, **_fields(exact[0]))
    transfer = mine[0]

    block_timestamp, head = _block_time_and_head(w3, block_hash)
    block_time = datetime.fromtimestamp(block_timestamp, tz=UTC)
    seen = max(0, head - block_number + 1)
    found = {**block, **_fields(transfer), "block_time": block_time, "confirmations": seen}
    # Block times are whole seconds: a block stamped in the intent's own second may hold a
    # transfer sent just after it, so only an earlier second counts as "before".
    if block_time < not_before.replace(microsecond=0):
        return result("failed", "before_intent", **found)
    if seen < required:
        return result("pending", "awaiting_confirmations", **found)
    return result("confirmed", None, **found)


def _block_time_and_head(w3: Web3, block_hash: str) -> tuple[int, int]:
    """The receipt's block's timestamp (by hash: the very block the receipt names) and the chain's
    head, in one JSON-RPC batch — one round trip, not two (the check is mostly network time)."""
    answers = call(lambda: w3.provider.make_batch_request([  # type: ignore[attr-defined]
        (RPCEndpoint("eth_getBlockByHash"), [block_hash, False]), (RPCEndpoint("eth_blockNumber"), [])]))
    if not isinstance(answers, list) or len(answers) != 2 or any("error" in a or a.get("result") is None
                                                                 for a in answers):
        logger.warning("payment chain node gave no block header or head")
        raise ChainUnavailable("The payment chain cannot be read; retry shortly.")
    return int(answers[0]["result"]["timestamp"], 16), int(answers[1]["result"], 16)


def _fields(transfer: _Transfer) -> dict[str, Any]:
    return {"log_index": transfer.log_index, "sender": transfer.sender, "recipient": transfer.recipient,
            "amount": transfer.amount}


def still_canonical(tx_hash: str, block_hash: str) -> bool:
    """Is the transaction still in the block we saw it in? False once a reorg dropped or moved it."""
    config = chain_config()
    tx_hash = normalize_tx_hash(tx_hash)
    w3 = web3_client(config)
    try:
        receipt = call(lambda: w3.eth.get_transaction_receipt(HexBytes(tx_hash)))
    except TransactionNotFound:
        return False
    return HexBytes(receipt["blockHash"]) == HexBytes(block_hash) and int(receipt["status"]) == 1


# ---------------------------------------------------------------------------------------------
# Watching the treasury


@dataclass(frozen=True)
class TreasuryTransfer:
    tx_hash: str
    log_index: int
    block_number: int
    block_hash: str
    sender: str
    recipient: str
    amount: int


def treasury_transfers(from_block: int, to_block: int) -> list[TreasuryTransfer]:
    """USDC transfers into the treasury in blocks [from_block, to_block], oldest first.

    One eth_getLogs per CHAIN_LOG_RANGE blocks (providers refuse wide ranges), filtered by the node
    on the USDC contract, the Transfer topic and the treasury as `to`; a range the node still
    refuses (too many results) is halved and retried. Blocks past the head are not scanned: keep
    the watcher's cursor at min(to_block, head_block()). The logs are read raw: web3's per-field
    formatting would dominate the cost of a busy treasury's scan.
    """
    if from_block < 0 or to_block < from_block:
        raise InvalidInput("from_block must be ≥ 0 and ≤ to_block.", code="invalid_block_range")
    config = chain_config()
    w3 = web3_client(config)
    # Nodes refuse ranges past their head; blocks that do not exist yet hold no transfers.
    to_block = min(to_block, int(call(lambda: w3.eth.block_number)))
    treasury_topic = "0x" + "00" * 12 + config.treasury[2:].lower()
    found: list[TreasuryTransfer] = []
    start = from_block
    span = config.log_range
    while start <= to_block:
        end = min(to_block, start + span - 1)
        query = {"fromBlock": hex(start), "toBlock": hex(end), "address": config.usdc_contract,
                 "topics": [TRANSFER_TOPIC, None, treasury_topic]}
        answer = call(partial(w3.provider.make_request, RPCEndpoint("eth_getLogs"), [query]))
        if "error" in answer:
            if end > start:
                span = max(1, (end - start + 1) // 2)
                continue
            logger.warning("payment chain node refused eth_getLogs for one block")
            raise ChainUnavailable("The payment chain cannot be read; retry shortly.")
        for entry in answer["result"]:
            if entry.get("removed"):
                continue
            data = entry["data"]
            if len(entry["topics"]) != 3 or len(data) != 66:  # one 32-byte word, 0x-prefixed
                continue
            found.append(TreasuryTransfer(
                tx_hash=entry["transactionHash"].lower(), log_index=int(entry["logIndex"], 16),
                block_number=int(entry["blockNumber"], 16), block_hash=entry["blockHash"].lower(),
                sender=_checksummed(entry["topics"][1][-40:].lower()), recipient=config.treasury,
                amount=int(data, 16),
            ))
        start = end + 1
        span = config.log_range
    found.sort(key=lambda t: (t.block_number, t.log_index))
    return found
