"""Verifying USDC payments on the chain itself (issue 17; docs/kernle-protocol.md §12.8).

Pure chain logic, no models: the billing services decide what a check means for a payment. A
transfer counts only when everything here agrees — the receipt succeeded, a `Transfer` log was
emitted by the configured USDC contract (a look-alike token's identical log is ignored), to the
configured treasury, of exactly the expected base units, from one of the paying organization's
linked wallets, in a block after the intent was created, on the configured chain, with at least
PAYMENT_CONFIRMATIONS confirmations ("pending" until then). Nothing is configured → 503
BillingUnavailable (fail closed); the node does not answer → 503 ChainUnavailable.

Agents pay over HTTP 402 with the x402 "exact" scheme (EIP-3009 `transferWithAuthorization`,
signed by the agent's wallet with PyPI `x402`'s own client). We settle it ourselves, no
facilitator: every check below runs before our relayer account submits the authorization, and
the resulting transaction is then inspected like any other transfer. The relayer account signs
with consecutive nonces, so every web process takes its turn under one PostgreSQL advisory lock
keyed on the relayer's address, held from reading the nonce to sending (`_relayer_turn`).

No log line here carries an RPC URL (it may embed a provider's API key) or a key.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache, partial
from typing import Any, Literal, TypeVar

from django.conf import settings
from django.db import OperationalError, connection, transaction
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_keys.exceptions import BadSignature
from eth_typing import ChecksumAddress
from eth_utils import ValidationError as EthValidationError
from eth_utils import keccak, to_checksum_address
from hexbytes import HexBytes
from web3 import HTTPProvider, Web3
from web3.exceptions import (
    ContractLogicError,
    TimeExhausted,
    TransactionNotFound,
    Web3Exception,
    Web3RPCError,
)
from web3.types import RPCEndpoint

from memoryhub.errors import BillingUnavailable, ChainUnavailable, InvalidInput, Unprocessable

logger = logging.getLogger(__name__)

TRANSFER_TOPIC = "0x" + keccak(text="Transfer(address,address,uint256)").hex()
_SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
_SECP256K1_HALF_ORDER = _SECP256K1_ORDER // 2
_TX_HASH = re.compile(r"0x[0-9a-fA-F]{64}")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_NONCE = re.compile(r"0x[0-9a-fA-F]{64}")
_SIGNATURE = re.compile(r"0x[0-9a-fA-F]{130}")  # r, s, v: 65 bytes
# An authorization must stay valid this long after we look at it, or it may expire in the mempool
# (Base makes a block every 2 s; the margin covers a few of them and our own round trips).
SETTLEMENT_MARGIN_SECONDS = 30
SETTLEMENT_RECEIPT_TIMEOUT_SECONDS = 30

# Just the parts of the token's ABI we call: the same on Base's USDC (FiatTokenV2) and TestUSDC.
TOKEN_ABI: list[dict[str, Any]] = [
    {"type": "function", "name": "name", "stateMutability": "view", "inputs": [],
     "outputs": [{"name": "", "type": "string"}]},
    {"type": "function", "name": "version", "stateMutability": "view", "inputs": [],
     "outputs": [{"name": "", "type": "string"}]},
    {"type": "function", "name": "balanceOf", "stateMutability": "view",
     "inputs": [{"name": "account", "type": "address"}], "outputs": [{"name": "", "type": "uint256"}]},
    {"type": "function", "name": "authorizationState", "stateMutability": "view",
     "inputs": [{"name": "authorizer", "type": "address"}, {"name": "nonce", "type": "bytes32"}],
     "outputs": [{"name": "", "type": "bool"}]},
    {"type": "function", "name": "transferWithAuthorization", "stateMutability": "nonpayable",
     "inputs": [{"name": "from", "type": "address"}, {"name": "to", "type": "address"},
                {"name": "value", "type": "uint256"}, {"name": "validAfter", "type": "uint256"},
                {"name": "validBefore", "type": "uint256"}, {"name": "nonce", "type": "bytes32"},
                {"name": "v", "type": "uint8"}, {"name": "r", "type": "bytes32"}, {"name": "s", "type": "bytes32"}],
     "outputs": []},
]
_AUTHORIZATION_TYPES = {
    "EIP712Domain": [
        {"name": "name", "type": "string"}, {"name": "version", "type": "string"},
        {"name": "chainId", "type": "uint256"}, {"name": "verifyingContract", "type": "address"},
    ],
    "TransferWithAuthorization": [
        {"name": "from", "type": "address"}, {"name": "to", "type": "address"},
        {"name": "value", "type": "uint256"}, {"name": "validAfter", "type": "uint256"},
        {"name": "validBefore", "type": "uint256"}, {"name": "nonce", "type": "bytes32"},
    ],
}

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
class ChainConfig:
    rpc_url: str
    chain_id: int
    usdc_contract: ChecksumAddress
    treasury: ChecksumAddress
    confirmations: int
    relayer_key: str
    log_range: int
    timeout: int

    @property
    def network(self) -> str:
        """CAIP-2 name of the chain, as x402 spells it."""
        return f"eip155:{self.chain_id}"


def chain_config() -> ChainConfig:
    """The payment chain from settings; BillingUnavailable (503) when payments cannot be checked."""
    if not settings.CHAIN_RPC_URL:
        raise BillingUnavailable("Payments are not configured on this server (no CHAIN_RPC_URL).")
    if not settings.TREASURY_ADDRESS:
        raise BillingUnavailable("Payments are not configured on this server (no TREASURY_ADDRESS).")
    if not settings.USDC_CONTRACT:
        raise BillingUnavailable("Payments are not configured on this server (no USDC_CONTRACT).")
    return ChainConfig(
        rpc_url=settings.CHAIN_RPC_URL,
        chain_id=int(settings.CHAIN_ID),
        usdc_contract=to_checksum_address(settings.USDC_CONTRACT),
        treasury=to_checksum_address(settings.TREASURY_ADDRESS),
        confirmations=int(settings.PAYMENT_CONFIRMATIONS),
        relayer_key=settings.CHAIN_RELAYER_KEY,
        log_range=int(settings.CHAIN_LOG_RANGE),
        timeout=int(settings.CHAIN_RPC_TIMEOUT_SECONDS),
    )


_clients: dict[tuple[str, int], Web3] = {}
_node_chain_ids: dict[str, int] = {}
_token_domains: dict[tuple[str, str], tuple[str, str]] = {}

# The x402 relayer's turn: a PostgreSQL advisory lock (namespace, hashtext(lowercase relayer
# address)), shared by every web process and thread on the database ("MH", issue 17; other
# namespaces: memories/events.py, memories/lifecycle/jobs.py). A settlement waits this long for
# its turn, then answers 503 chain_unavailable with Retry-After rather than hold the request.
RELAYER_LOCK_NAMESPACE = 0x4D480011
RELAYER_LOCK_WAIT_SECONDS = 30
_LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE of a lock wait that ran into lock_timeout


def _web3(config: ChainConfig) -> Web3:
    key = (config.rpc_url, config.timeout)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = Web3(HTTPProvider(config.rpc_url, request_kwargs={"timeout": config.timeout}))
    return client


T = TypeVar("T")


@contextmanager
def _node() -> Iterator[None]:
    """Any failure to talk to the node is ChainUnavailable (503, retry later), never a 500."""
    try:
        yield
    except (TransactionNotFound, ContractLogicError):
        raise
    except (OSError, Web3Exception) as exc:
        # requests' ConnectionError/Timeout are OSErrors; web3 raises Web3RPCError for an error answer.
        logger.warning("payment chain node unavailable: %s", type(exc).__name__)
        raise ChainUnavailable("The payment chain cannot be reached; retry shortly.") from exc


def _call(fn: Callable[[], T]) -> T:
    with _node():
        return fn()


def _node_chain_id(config: ChainConfig, w3: Web3) -> int:
    """What chain the node is on (asked once per process and URL: it does not change)."""
    if config.rpc_url not in _node_chain_ids:
        _node_chain_ids[config.rpc_url] = int(_call(lambda: w3.eth.chain_id))
    return _node_chain_ids[config.rpc_url]


def head_block() -> int:
    """The chain's latest block number."""
    config = chain_config()
    w3 = _web3(config)
    return int(_call(lambda: w3.eth.block_number))


def explorer_tx_url(tx_hash: str) -> str | None:
    """A block explorer link for a transaction (None on the development chain)."""
    base = settings.CHAIN_EXPLORER_URL
    return f"{base.rstrip('/')}/tx/{tx_hash}" if base else None


# ---------------------------------------------------------------------------------------------
# Inspecting one transfer


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
    hashing was most of a 10,000-transfer scan (bench/payments.py)."""
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


def _addresses(values: Iterable[str]) -> frozenset[str]:
    return frozenset(to_checksum_address(v) for v in values if isinstance(v, str) and _ADDRESS.fullmatch(v))


def inspect_transfer(tx_hash: str, *, expected_amount: int, expected_from: Iterable[str],
                     not_before: datetime, confirmations: int | None = None) -> TransferCheck:
    """Does transaction `tx_hash` pay exactly `expected_amount` USDC base units into the treasury
    from one of `expected_from`, after `not_before`? See the module docstring for every rule."""
    config = chain_config()
    tx_hash = normalize_tx_hash(tx_hash)
    linked = _addresses(expected_from)
    required = config.confirmations if confirmations is None else confirmations
    w3 = _web3(config)

    def result(status: Status, reason: str | None, **fields: Any) -> TransferCheck:
        return TransferCheck(status=status, reason=reason, chain_id=config.chain_id, tx_hash=tx_hash, **fields)

    if _node_chain_id(config, w3) != config.chain_id:
        return result("failed", "wrong_chain")
    try:
        receipt = _call(lambda: w3.eth.get_transaction_receipt(HexBytes(tx_hash)))
    except TransactionNotFound:
        try:
            _call(lambda: w3.eth.get_transaction(HexBytes(tx_hash)))
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
    answers = _call(lambda: w3.provider.make_batch_request([  # type: ignore[attr-defined]
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
    w3 = _web3(config)
    try:
        receipt = _call(lambda: w3.eth.get_transaction_receipt(HexBytes(tx_hash)))
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
    formatting is most of the cost at ten thousand transfers.
    """
    if from_block < 0 or to_block < from_block:
        raise InvalidInput("from_block must be ≥ 0 and ≤ to_block.", code="invalid_block_range")
    config = chain_config()
    w3 = _web3(config)
    # Nodes refuse ranges past their head; blocks that do not exist yet hold no transfers.
    to_block = min(to_block, int(_call(lambda: w3.eth.block_number)))
    treasury_topic = "0x" + "00" * 12 + config.treasury[2:].lower()
    found: list[TreasuryTransfer] = []
    start = from_block
    span = config.log_range
    while start <= to_block:
        end = min(to_block, start + span - 1)
        query = {"fromBlock": hex(start), "toBlock": hex(end), "address": config.usdc_contract,
                 "topics": [TRANSFER_TOPIC, None, treasury_topic]}
        answer = _call(partial(w3.provider.make_request, RPCEndpoint("eth_getLogs"), [query]))
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


# ---------------------------------------------------------------------------------------------
# x402: agents pay with a signed EIP-3009 authorization that we settle ourselves


class SettlementRefused(Unprocessable):
    """An x402 authorization we will not submit; `reason` says which check refused it."""

    code = "payment_refused"

    def __init__(self, reason: str, message: str):
        super().__init__(message, fields={"reason": [reason]})
        self.reason = reason


@dataclass(frozen=True)
class X402Payment:
    authorization: dict[str, Any]
    signature: str
    payer: str


def _token_domain(config: ChainConfig, w3: Web3) -> tuple[str, str]:
    """The token's EIP-712 name and version, read from the contract once per process."""
    key = (config.rpc_url, config.usdc_contract)
    if key not in _token_domains:
        token = w3.eth.contract(address=config.usdc_contract, abi=TOKEN_ABI)
        name = _call(lambda: token.functions.name().call())
        version = _call(lambda: token.functions.version().call())
        _token_domains[key] = (str(name), str(version))
    return _token_domains[key]


def x402_requirements(amount: int, *, max_timeout_seconds: int = 600) -> Any:
    """What we accept for `amount` base units: x402 `exact` on our chain, our USDC, our treasury."""
    from x402.schemas import PaymentRequirements

    config = chain_config()
    name, version = _token_domain(config, _web3(config))
    return PaymentRequirements(scheme="exact", network=config.network, asset=config.usdc_contract,
                               amount=str(amount), pay_to=config.treasury, max_timeout_seconds=max_timeout_seconds,
                               extra={"name": name, "version": version})


def x402_payment_required(amount: int, *, resource_url: str, description: str,
                          max_timeout_seconds: int = 600) -> tuple[dict[str, Any], str]:
    """(JSON body of the 402 answer, value of its `PAYMENT-REQUIRED` header), x402 version 2."""
    from x402.http.utils import encode_payment_required_header
    from x402.schemas import PaymentRequired, ResourceInfo

    required = PaymentRequired(error="Payment required",
                               resource=ResourceInfo(url=resource_url, description=description),
                               accepts=[x402_requirements(amount, max_timeout_seconds=max_timeout_seconds)])
    return required.model_dump(by_alias=True, exclude_none=True), encode_payment_required_header(required)


def x402_decode_payment(header_value: str) -> X402Payment:
    """The authorization in an agent's `PAYMENT-SIGNATURE` header (x402 v2, scheme `exact`)."""
    from pydantic import ValidationError
    from x402.http.utils import decode_payment_signature_header
    from x402.schemas import PaymentPayload

    config = chain_config()
    try:
        payload = decode_payment_signature_header(header_value)
    except (ValueError, TypeError, ValidationError, UnicodeDecodeError) as exc:
        raise InvalidInput("The x402 payment header is not valid base64 JSON of a payment payload.",
                           code="invalid_payment") from exc
    if not isinstance(payload, PaymentPayload):
        raise InvalidInput("Only x402 version 2 payments are accepted.", code="invalid_payment")
    if payload.accepted.scheme != "exact" or payload.accepted.network != config.network:
        raise InvalidInput(f"Only the x402 `exact` scheme on {config.network} is accepted.", code="invalid_payment")
    authorization = payload.payload.get("authorization")
    signature = payload.payload.get("signature")
    if not isinstance(authorization, dict) or not isinstance(signature, str):
        raise InvalidInput("The x402 payment carries no EIP-3009 authorization and signature.", code="invalid_payment")
    payer = authorization.get("from")
    if not isinstance(payer, str) or not _ADDRESS.fullmatch(payer):
        raise InvalidInput("The x402 authorization's `from` is not an address.", code="invalid_payment")
    if not _is_ecdsa_signature(signature):
        raise InvalidInput("The x402 signature is not a 65-byte secp256k1 signature (r and s between 1 and the "
                           "curve order, v 0, 1, 27 or 28).", code="invalid_signature",
                           fields={"signature": ["Not a secp256k1 signature."]})
    return X402Payment(authorization=authorization, signature=signature, payer=to_checksum_address(payer))


def _is_ecdsa_signature(signature: str) -> bool:
    """Is this hex a signature at all (whoever made it)? 0x00…00 is not: no key signs with r or s
    zero, and the library refuses to recover from it. Such input is refused as malformed, before
    anything is stored; a real signature by the wrong key is SettlementRefused `bad_signature`."""
    if not _SIGNATURE.fullmatch(signature):
        return False
    raw = bytes.fromhex(signature[2:])
    r, s = int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:64], "big")
    return 0 < r < _SECP256K1_ORDER and 0 < s < _SECP256K1_ORDER and raw[64] in (0, 1, 27, 28)


def x402_settle_response_header(tx_hash: str, payer: str, amount: int | None = None) -> str:
    """Value of the `PAYMENT-RESPONSE` header after a settlement."""
    from x402.http.utils import encode_payment_response_header
    from x402.schemas import SettleResponse

    config = chain_config()
    return encode_payment_response_header(SettleResponse(
        success=True, payer=payer, transaction=tx_hash, network=config.network,
        amount=None if amount is None else str(amount)))


@dataclass(frozen=True)
class _Authorization:
    sender: str
    recipient: str
    value: int
    valid_after: int
    valid_before: int
    nonce: bytes


def _parse_authorization(authorization: dict[str, Any], signature: str) -> tuple[_Authorization, bytes]:
    def refuse() -> SettlementRefused:
        return SettlementRefused("malformed", "The x402 authorization or signature is malformed.")

    try:
        parsed = _Authorization(
            sender=authorization["from"], recipient=authorization["to"], value=int(authorization["value"]),
            valid_after=int(authorization["validAfter"]), valid_before=int(authorization["validBefore"]),
            nonce=bytes(HexBytes(authorization["nonce"])),
        )
        raw_signature = bytes(HexBytes(signature))
    except (KeyError, TypeError, ValueError) as exc:
        raise refuse() from exc
    addresses_ok = all(isinstance(a, str) and _ADDRESS.fullmatch(a) for a in (parsed.sender, parsed.recipient))
    nonce_ok = isinstance(authorization["nonce"], str) and _NONCE.fullmatch(authorization["nonce"])
    if not addresses_ok or not nonce_ok or len(raw_signature) != 65 or min(parsed.value, parsed.valid_after) < 0:
        raise refuse()
    return _Authorization(to_checksum_address(parsed.sender), to_checksum_address(parsed.recipient), parsed.value,
                          parsed.valid_after, parsed.valid_before, parsed.nonce), raw_signature


def _signer(config: ChainConfig, w3: Web3, auth: _Authorization, signature: bytes) -> str | None:
    """Who signed this TransferWithAuthorization for our token's EIP-712 domain (None if nobody).
    The one place an x402 signature is verified: every way the library refuses one (no point on
    the curve, r or s zero or out of range — eth_keys' BadSignature, which is no ValueError —, a v
    it does not know) is "nobody", never an exception (a 500)."""
    if int.from_bytes(signature[32:64], "big") > _SECP256K1_HALF_ORDER:
        return None  # the malleable twin of a signature: the token refuses it, so do we
    name, version = _token_domain(config, w3)
    typed = {
        "types": _AUTHORIZATION_TYPES,
        "primaryType": "TransferWithAuthorization",
        "domain": {"name": name, "version": version, "chainId": config.chain_id,
                   "verifyingContract": config.usdc_contract},
        "message": {"from": auth.sender, "to": auth.recipient, "value": auth.value, "validAfter": auth.valid_after,
                    "validBefore": auth.valid_before, "nonce": auth.nonce},
    }
    try:
        return str(Account.recover_message(encode_typed_data(full_message=typed), signature=signature))
    except (ValueError, TypeError, BadSignature, EthValidationError):
        return None


@dataclass(frozen=True)
class CheckedAuthorization:
    """An x402 authorization that passed every check made before submitting it (x402_check)."""

    authorization: _Authorization
    signature: bytes


def x402_check(authorization: dict[str, Any], signature: str, *, expected_amount: int,
               expected_from: Iterable[str]) -> CheckedAuthorization:
    """Check an x402 `exact` authorization completely without sending anything: recipient, amount,
    linked sender, signature, validity window, unused nonce, funds. Refusals raise
    SettlementRefused with a reason; the node not answering raises ChainUnavailable. The billing
    services run this before they store anything."""
    config = chain_config()
    if not config.relayer_key:
        raise BillingUnavailable("x402 payments are not configured on this server (no CHAIN_RELAYER_KEY).")
    auth, raw_signature = _parse_authorization(authorization, signature)
    if auth.recipient != config.treasury:
        raise SettlementRefused("wrong_recipient", "The authorization does not pay the treasury address.")
    if auth.value != expected_amount:
        raise SettlementRefused("wrong_amount", "The authorization is not for exactly the amount due.")
    if auth.sender not in _addresses(expected_from):
        raise SettlementRefused("sender_not_linked", "The paying wallet is not linked to this organization.")
    w3 = _web3(config)
    if _node_chain_id(config, w3) != config.chain_id:
        raise ChainUnavailable("The payment node is on another chain than the one configured.")
    if _signer(config, w3, auth, raw_signature) != auth.sender:
        raise SettlementRefused("bad_signature", "The authorization is not signed by its `from` wallet.")
    latest = _call(lambda: w3.eth.get_block("latest"))
    now = max(int(latest["timestamp"]), int(time.time()))
    if auth.valid_after >= now:
        raise SettlementRefused("not_yet_valid", "The authorization is not valid yet (validAfter).")
    if auth.valid_before <= now + SETTLEMENT_MARGIN_SECONDS:
        raise SettlementRefused("expired", "The authorization has expired or expires too soon (validBefore).")
    token = w3.eth.contract(address=config.usdc_contract, abi=TOKEN_ABI)
    if _call(lambda: token.functions.authorizationState(auth.sender, auth.nonce).call()):
        raise SettlementRefused("nonce_used", "This authorization has already been used.")
    if int(_call(lambda: token.functions.balanceOf(auth.sender).call())) < auth.value:
        raise SettlementRefused("insufficient_funds", "The paying wallet does not hold enough USDC.")
    return CheckedAuthorization(auth, raw_signature)


def x402_submit(checked: CheckedAuthorization) -> str:
    """Submit a checked authorization from our relayer account; the transaction hash (0x
    lowercase). The token itself may still refuse it (simulated before sending: SettlementRefused
    `rejected_by_token`); the returned transaction still goes through inspect_transfer like a
    pasted hash."""
    config = chain_config()
    w3 = _web3(config)
    auth, raw_signature = checked.authorization, checked.signature
    token = w3.eth.contract(address=config.usdc_contract, abi=TOKEN_ABI)
    relayer = Account.from_key(config.relayer_key)
    call = token.functions.transferWithAuthorization(
        auth.sender, auth.recipient, auth.value, auth.valid_after, auth.valid_before, auth.nonce,
        raw_signature[64] if raw_signature[64] >= 27 else raw_signature[64] + 27,
        raw_signature[:32], raw_signature[32:64])
    # One relayer account signs with consecutive nonces: one settlement at a time across processes.
    with _relayer_turn(relayer.address):
        try:
            tx = _call(lambda: call.build_transaction({
                "from": relayer.address, "chainId": config.chain_id,
                "nonce": w3.eth.get_transaction_count(relayer.address, "pending")}))
        except ContractLogicError as exc:  # the token itself refuses (simulated before sending)
            raise SettlementRefused("rejected_by_token", "The token contract refused the authorization.") from exc
        signed = relayer.sign_transaction(tx)
        sent = _call(lambda: w3.eth.send_raw_transaction(signed.raw_transaction))
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
