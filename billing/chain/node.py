"""The payment chain's configuration, the node client and the token contract's plumbing (the
package docstring has the overview; docs/billing.md §3, §6).

`chain_config()` reads the settings and fails closed (503 BillingUnavailable) when payments cannot
be checked; every call to the node goes through `call()`, so any failure to talk to it is 503
ChainUnavailable, never a 500.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings
from eth_typing import ChecksumAddress
from eth_utils import keccak, to_checksum_address
from web3 import HTTPProvider, Web3
from web3.exceptions import ContractLogicError, TransactionNotFound, Web3Exception

from memoryhub.errors import BillingUnavailable, ChainUnavailable

logger = logging.getLogger(__name__)

TRANSFER_TOPIC = "0x" + keccak(text="Transfer(address,address,uint256)").hex()
ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")

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


def web3_client(config: ChainConfig) -> Web3:
    """The process's client for the configured node (one per URL and timeout)."""
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


def call(fn: Callable[[], T]) -> T:
    """`fn()`, one request to the node: a failure to reach it is ChainUnavailable."""
    with _node():
        return fn()


def node_chain_id(config: ChainConfig, w3: Web3) -> int:
    """What chain the node is on (asked once per process and URL: it does not change)."""
    if config.rpc_url not in _node_chain_ids:
        _node_chain_ids[config.rpc_url] = int(call(lambda: w3.eth.chain_id))
    return _node_chain_ids[config.rpc_url]


def head_block() -> int:
    """The chain's latest block number."""
    config = chain_config()
    w3 = web3_client(config)
    return int(call(lambda: w3.eth.block_number))


def explorer_tx_url(tx_hash: str) -> str | None:
    """A block explorer link for a transaction (None on the development chain)."""
    base = settings.CHAIN_EXPLORER_URL
    return f"{base.rstrip('/')}/tx/{tx_hash}" if base else None


def token_domain(config: ChainConfig, w3: Web3) -> tuple[str, str]:
    """The token's EIP-712 name and version, read from the contract once per process."""
    key = (config.rpc_url, config.usdc_contract)
    if key not in _token_domains:
        token = w3.eth.contract(address=config.usdc_contract, abi=TOKEN_ABI)
        name = call(lambda: token.functions.name().call())
        version = call(lambda: token.functions.version().call())
        _token_domains[key] = (str(name), str(version))
    return _token_domains[key]
