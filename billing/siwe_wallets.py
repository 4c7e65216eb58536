"""Linking a wallet by Sign-In with Ethereum (EIP-4361, PyPI `siwe`; docs/billing.md §2).

1. The caller asks for a nonce: random, single-use, valid for NONCE_LIFETIME, issued to its
   organization (only its SHA-256 is stored).
2. The wallet signs an EIP-4361 message carrying that nonce, our domain and our chain id.
3. `wallet_link` parses the message, checks the domain (SIWE_DOMAIN, else the request's own host,
   which Django has already checked against ALLOWED_HOSTS), the chain id (CHAIN_ID), the message's
   own validity window and the signature — an externally owned account's by recovering the signer
   (eth_account), a contract wallet's by asking the contract (EIP-1271 `isValidSignature`, siwe's
   own check with our node as its web3 provider) through CHAIN_RPC_URL, on a node that must be on
   CHAIN_ID; the node not answering is 503 chain_unavailable, never "bad signature" — and then
   consumes the nonce with one conditional UPDATE, so a replayed message finds it used.

Only then is the address linked to the organization; a linked wallet is what ties an on-chain
transfer to the organization that pays (billing.services).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import requests
import siwe
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from eth_account.messages import encode_defunct
from eth_keys.exceptions import BadSignature
from siwe.siwe import check_contract_wallet_signature
from web3 import HTTPProvider, Web3
from web3.exceptions import Web3Exception

from accounts.principal import Principal
from accounts.services import audit_record
from billing.models import SiweNonce, Wallet
from billing.selectors import ensure_may_manage_billing, wallets_of
from memoryhub.errors import ChainUnavailable, DomainError, InvalidInput, NotFound

NONCE_LIFETIME = timedelta(minutes=10)
NONCE_LENGTH = 24  # alphanumeric (EIP-4361 wants at least 8): ~143 bits
MAX_MESSAGE_CHARS = 4000
_ALPHANUMERIC = string.ascii_letters + string.digits
_HEX_SIGNATURE = re.compile(r"0x(?:[0-9a-fA-F]{2})*")  # "0x" alone: a Safe's pre-approved message


class Gone(DomainError):
    status = 410
    code = "gone"


def _hash(nonce: str) -> str:
    return hashlib.sha256(nonce.encode()).hexdigest()


def expected_domain(request_host: str) -> str:
    return settings.SIWE_DOMAIN or request_host


@dataclass(frozen=True)
class IssuedNonce:
    nonce: str
    expires_at: datetime
    domain: str
    chain_id: int


def nonce_issue(*, principal: Principal, request_host: str, now: datetime | None = None) -> IssuedNonce:
    ensure_may_manage_billing(principal)
    now = now or timezone.now()
    nonce = "".join(secrets.choice(_ALPHANUMERIC) for _ in range(NONCE_LENGTH))
    SiweNonce.objects.create(organization=principal.organization, nonce_hash=_hash(nonce),
                             created_at=now, expires_at=now + NONCE_LIFETIME)
    # Keep the table small: nonces nobody used are worth nothing a day later.
    SiweNonce.objects.filter(expires_at__lt=now - timedelta(days=1)).delete()
    return IssuedNonce(nonce=nonce, expires_at=now + NONCE_LIFETIME, domain=expected_domain(request_host),
                       chain_id=int(settings.CHAIN_ID))


def _refuse(message: str, code: str, **fields: Any) -> InvalidInput:
    return InvalidInput(message, code=code, fields=fields or None)


def _parse(message: object) -> siwe.SiweMessage:
    if not isinstance(message, str) or not message or len(message) > MAX_MESSAGE_CHARS:
        raise _refuse("message must be an EIP-4361 (Sign-In with Ethereum) message.", "siwe_malformed")
    try:
        return siwe.SiweMessage.from_message(message)
    except Exception:  # pydantic, ValueError, and the ABNF parser's own error types
        raise _refuse("message is not a valid EIP-4361 (Sign-In with Ethereum) message.", "siwe_malformed") from None


def _verify_signature(parsed: siwe.SiweMessage, signature: str, *, domain: str, nonce: str, now: datetime) -> str:
    """The wallet kind whose signature this is; raises InvalidInput when it is none's. The one
    place a SIWE signature is verified: whatever the libraries make of the bytes, a signature
    nobody made is 400 `siwe_bad_signature`, never a 500, and nothing is stored."""
    try:
        parsed.verify(signature, domain=domain, nonce=nonce, timestamp=now)
        return Wallet.Kind.EOA
    except siwe.ExpiredMessage:
        raise _refuse("The signed message has expired.", "siwe_expired") from None
    except siwe.NotYetValidMessage:
        raise _refuse("The signed message is not valid yet.", "siwe_not_yet_valid") from None
    except (siwe.InvalidSignature, BadSignature):
        # Not the address's key. eth_keys refuses some bytes outright with BadSignature, which siwe
        # lets through: r or s zero (0x00…00) or past the curve order. Such bytes are no key's
        # signature, but a contract wallet may still accept them (a Safe's approved-hash signature
        # has s = 0), so they go on to the contract check like any other.
        pass
    except (ValueError, TypeError):
        raise _refuse("signature is not a hexadecimal signature.", "siwe_bad_signature") from None
    if not settings.CHAIN_RPC_URL:
        raise _refuse("The signature does not match the address.", "siwe_bad_signature")
    # Not the address's own key: perhaps a contract wallet (EIP-1271), which only the chain can say.
    w3 = Web3(HTTPProvider(settings.CHAIN_RPC_URL, request_kwargs={"timeout": settings.CHAIN_RPC_TIMEOUT_SECONDS}))
    with _chain_node():
        if int(w3.eth.chain_id) != int(settings.CHAIN_ID):
            # The message names CHAIN_ID; a contract at this address on another chain proves nothing.
            raise ChainUnavailable("The chain node is on another chain than the one configured; retry later.")
        # siwe's own EIP-1271 check, called directly: its verify(provider=…) recovers a key's signer
        # first and would raise BadSignature again before asking the contract. The message's
        # domain, nonce and validity window passed the verify above.
        if check_contract_wallet_signature(address=parsed.address, signature=signature, w3=w3,
                                           message=encode_defunct(text=parsed.prepare_message())):
            return Wallet.Kind.CONTRACT
        is_contract = len(w3.eth.get_code(parsed.address)) > 0
    if is_contract:
        raise _refuse(f"The contract wallet {parsed.address} does not accept this signature (EIP-1271).",
                      "siwe_bad_signature")
    raise _refuse("The signature does not match the address.", "siwe_bad_signature")


@contextmanager
def _chain_node() -> Iterator[None]:
    """Talking to the node: any failure to get an answer is 503 chain_unavailable (Retry-After), so a
    contract wallet is never refused as "bad signature" because the node was down. siwe itself
    turns only a revert or an undecodable answer of `isValidSignature` into "invalid"."""
    try:
        yield
    except (requests.RequestException, OSError, Web3Exception):
        # requests' errors are OSErrors too; Web3RPCError is a JSON-RPC error answer (rate limit, …).
        raise ChainUnavailable("The chain node cannot be reached to check a contract wallet; retry shortly.",
                               code="chain_unavailable") from None


def wallet_link(*, principal: Principal, message: object, signature: object, request_host: str,
                ip: str | None = None, now: datetime | None = None) -> tuple[Wallet, bool]:
    """Link the address that signed `message` to the caller's organization. Returns (wallet,
    created); linking a wallet already linked is not an error."""
    ensure_may_manage_billing(principal)
    now = now or timezone.now()
    parsed = _parse(message)
    if not isinstance(signature, str) or len(signature) > 4000 or not _HEX_SIGNATURE.fullmatch(signature):
        raise _refuse("signature must be a 0x-prefixed hexadecimal signature.", "siwe_bad_signature")
    domain = expected_domain(request_host)
    if parsed.domain != domain:
        raise _refuse(f"The message was signed for {parsed.domain!r}, not for {domain!r}.", "siwe_wrong_domain")
    if int(parsed.chain_id) != int(settings.CHAIN_ID):
        raise _refuse(f"The message names chain {parsed.chain_id}; payments here are on chain {settings.CHAIN_ID}.",
                      "siwe_wrong_chain")
    nonce = SiweNonce.objects.filter(nonce_hash=_hash(parsed.nonce), organization_id=principal.organization.pk).first()
    if nonce is None or nonce.consumed_at is not None:
        raise _refuse("The nonce is unknown or already used; ask for a new one.", "siwe_nonce_invalid")
    if nonce.expires_at <= now:
        raise _refuse("The nonce has expired; ask for a new one.", "siwe_nonce_expired")
    kind = _verify_signature(parsed, signature, domain=domain, nonce=parsed.nonce, now=now)
    with transaction.atomic():
        consumed = SiweNonce.objects.filter(pk=nonce.pk, consumed_at__isnull=True, expires_at__gt=now).update(
            consumed_at=now)
        if consumed != 1:  # a concurrent request with the same message won the race
            raise _refuse("The nonce is unknown or already used; ask for a new one.", "siwe_nonce_invalid")
        address = str(parsed.address)
        try:
            with transaction.atomic():
                wallet, created = Wallet.objects.get_or_create(
                    organization=principal.organization, address=address,
                    defaults={"kind": kind, "linked_by": principal.user, "linked_at": now})
        except IntegrityError:  # linked by a concurrent request
            wallet, created = Wallet.objects.get(organization=principal.organization, address=address), False
        if created:
            audit_record(organization=principal.organization, action="wallet.linked", principal=principal,
                         target_type="wallet", target_id=address, ip=ip, metadata={"kind": kind})
    return wallet, created


@transaction.atomic
def wallet_unlink(*, principal: Principal, address: str, ip: str | None = None) -> None:
    ensure_may_manage_billing(principal)
    wallet = wallets_of(principal.organization).filter(address__iexact=address[:42]).first()
    if wallet is None:
        raise NotFound("No such wallet is linked to this organization.", code="wallet_not_found")
    wallet.delete()
    audit_record(organization=principal.organization, action="wallet.unlinked", principal=principal,
                 target_type="wallet", target_id=wallet.address, ip=ip)


def claim_retired() -> Gone:
    """`POST /wallets/claim {owner_eoa}` took an address on trust; claiming is replaced by proof."""
    return Gone("Claiming a wallet by address is retired: link it by signing a Sign-In with Ethereum message "
               "(GET /api/v1/wallets/nonce, then POST /api/v1/wallets/link).", code="wallet_claim_retired")
