"""An agent's x402 `exact` payment, checked completely before anything is submitted (the package
docstring has the overview; docs/billing.md §4).

Agents pay over HTTP 402 with the x402 "exact" scheme (EIP-3009 `transferWithAuthorization`,
signed by the agent's wallet with PyPI `x402`'s own client). We settle it ourselves, no
facilitator: every check here (`x402_check`) runs before our relayer account submits the
authorization (billing.chain.relayer), and the resulting transaction is then inspected like any
other transfer (billing.chain.transfers).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_keys.exceptions import BadSignature
from eth_utils import ValidationError as EthValidationError
from eth_utils import to_checksum_address
from hexbytes import HexBytes
from web3 import Web3

from billing.chain.node import (
    ADDRESS,
    TOKEN_ABI,
    ChainConfig,
    call,
    chain_config,
    node_chain_id,
    token_domain,
    web3_client,
)
from billing.chain.transfers import addresses
from memoryhub.errors import BillingUnavailable, ChainUnavailable, InvalidInput, Unprocessable

_SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
_SECP256K1_HALF_ORDER = _SECP256K1_ORDER // 2
_NONCE = re.compile(r"0x[0-9a-fA-F]{64}")
_SIGNATURE = re.compile(r"0x[0-9a-fA-F]{130}")  # r, s, v: 65 bytes
# An authorization must stay valid this long after we look at it, or it may expire in the mempool
# (Base makes a block every 2 s; the margin covers a few of them and our own round trips).
SETTLEMENT_MARGIN_SECONDS = 30
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



def x402_requirements(amount: int, *, max_timeout_seconds: int = 600) -> Any:
    """What we accept for `amount` base units: x402 `exact` on our chain, our USDC, our treasury."""
    from x402.schemas import PaymentRequirements

    config = chain_config()
    name, version = token_domain(config, web3_client(config))
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
    if not isinstance(payer, str) or not ADDRESS.fullmatch(payer):
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
    addresses_ok = all(isinstance(a, str) and ADDRESS.fullmatch(a) for a in (parsed.sender, parsed.recipient))
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
    name, version = token_domain(config, w3)
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
    if auth.sender not in addresses(expected_from):
        raise SettlementRefused("sender_not_linked", "The paying wallet is not linked to this organization.")
    w3 = web3_client(config)
    if node_chain_id(config, w3) != config.chain_id:
        raise ChainUnavailable("The payment node is on another chain than the one configured.")
    if _signer(config, w3, auth, raw_signature) != auth.sender:
        raise SettlementRefused("bad_signature", "The authorization is not signed by its `from` wallet.")
    latest = call(lambda: w3.eth.get_block("latest"))
    now = max(int(latest["timestamp"]), int(time.time()))
    if auth.valid_after >= now:
        raise SettlementRefused("not_yet_valid", "The authorization is not valid yet (validAfter).")
    if auth.valid_before <= now + SETTLEMENT_MARGIN_SECONDS:
        raise SettlementRefused("expired", "The authorization has expired or expires too soon (validBefore).")
    token = w3.eth.contract(address=config.usdc_contract, abi=TOKEN_ABI)
    if call(lambda: token.functions.authorizationState(auth.sender, auth.nonce).call()):
        raise SettlementRefused("nonce_used", "This authorization has already been used.")
    if int(call(lambda: token.functions.balanceOf(auth.sender).call())) < auth.value:
        raise SettlementRefused("insufficient_funds", "The paying wallet does not hold enough USDC.")
    return CheckedAuthorization(auth, raw_signature)

