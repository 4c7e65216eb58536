"""The development chain: an embedded Anvil node (a real EVM) with MemoryHub's USDC-like token.

`make run` starts Anvil (npm `@foundry-rs/anvil`, installed by `make install`) like the embedded
PostgreSQL and Redis (memoryhub/embedded.py): a supervised child on 127.0.0.1, its log in
<data dir>/logs/anvil.log, its state kept in <data dir>/anvil/state.json across restarts. The
first start deploys contracts/TestUSDC.sol (compiled from source by `make install` into
build/contracts/), mints to a few demo wallets and names a treasury; later starts find the
token still there. What it deployed is written to <data dir>/chain.json, which settings read
when CHAIN_RPC_URL is not set (docs/billing.md §6). The test session
uses the same pieces with a throw-away node (tests/billing/chain.py).

Every key here is one of Anvil's public development keys (the well-known "test test … junk"
mnemonic): worthless anywhere else, which is why they may sit in a file. Production configures
its relayer key through the environment only.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import subprocess
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memoryhub.embedded import EmbeddedServer, ManagedProcess

BASE_DIR = Path(__file__).resolve().parent.parent
ARTIFACT = BASE_DIR / "build" / "contracts" / "TestUSDC.json"
# The tests' EIP-1271 contract wallet (contracts/OwnerWallet.sol), built by the same compile step.
OWNER_WALLET_ARTIFACT = BASE_DIR / "build" / "contracts" / "OwnerWallet.json"
DEV_CHAIN_ID = 31337
TOKEN_NAME = "USD Coin (MemoryHub dev)"  # noqa: S105 - a token's name, not a password
LOOKALIKE_NAME = "USD Coin"  # a forger's copy: same code, same symbol, another address
USDC_DECIMALS = 6
# Anvil's development accounts, by index: who plays which part on the development chain.
OWNER_INDEX, TREASURY_INDEX, RELAYER_INDEX, FIRST_DEMO_INDEX = 0, 1, 2, 3
_PLATFORM_PACKAGES = {("Linux", "x86_64"): "linux-amd64", ("Linux", "aarch64"): "linux-arm64",
                      ("Darwin", "x86_64"): "darwin-amd64", ("Darwin", "arm64"): "darwin-arm64"}


def anvil_bin() -> Path:
    """The platform binary npm installed (an optional dependency of @foundry-rs/anvil). We run it
    directly rather than through the package's node wrapper: one process, signals reach it."""
    suffix = _PLATFORM_PACKAGES.get((platform.system(), platform.machine()))
    if suffix:
        binary = BASE_DIR / "node_modules" / "@foundry-rs" / f"anvil-{suffix}" / "bin" / "anvil"
        if binary.exists():
            return binary
    wrapper = BASE_DIR / "node_modules" / ".bin" / "anvil"
    if wrapper.exists():
        return wrapper
    raise RuntimeError("Anvil is not installed: run `make install` (npm ci installs @foundry-rs/anvil)")


def rpc_call(url: str, method: str, params: list[Any] | None = None, timeout: float = 5.0) -> Any:
    """One JSON-RPC call without web3 (used to wait for the node and by the test helpers)."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - our own node (http)
        answer = json.loads(response.read())
    if "error" in answer:
        raise RuntimeError(f"{method}: {answer['error'].get('message', answer['error'])}")
    return answer["result"]


@dataclass(frozen=True)
class DevAccount:
    address: str  # checksummed
    key: str  # 0x-prefixed hex private key (Anvil development key)


class EmbeddedAnvil(EmbeddedServer):
    """Anvil on 127.0.0.1:port. `block_time=None` mines each transaction at once and nothing
    else, so tests decide confirmations with `anvil_mine`; `make run` mines a block every few
    seconds like a real chain, so confirmations arrive on their own."""

    name = "anvil"
    port_variable = "MEMORYHUB_ANVIL_PORT"
    starting_errors = (OSError, RuntimeError, ValueError)  # refused, a JSON-RPC error, a half-written answer

    def __init__(self, port: int, *, data_dir: Path, log_path: Path | None = None,
                 block_time: int | None = None, persist: bool = False, accounts: int = 10):
        self.port = port
        self.data_dir = data_dir
        self.accounts_file = data_dir / "accounts.json"
        self.state_file = data_dir / "state.json" if persist else None
        argv = [str(anvil_bin()), "--host", "127.0.0.1", "--port", str(port),
                "--chain-id", str(DEV_CHAIN_ID), "--accounts", str(accounts),
                "--silent", "--config-out", str(self.accounts_file)]
        if block_time:
            argv += ["--block-time", str(block_time)]
        if self.state_file is not None:
            # Dumped on shutdown and every 30 s (a SIGKILL loses at most that much).
            argv += ["--state", str(self.state_file), "--state-interval", "30"]
        self.process = ManagedProcess(name="anvil", argv=argv, log_path=log_path, stop_signal=signal.SIGTERM)

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.accounts_file.unlink()  # rewritten by this start; waiting for it means "ready"

    def answers(self) -> bool:
        # Ready once it answers for our chain and has written its accounts file (prepare() removed the old one).
        return int(rpc_call(self.url(), "eth_chainId", timeout=1), 16) == DEV_CHAIN_ID and self.accounts_file.exists()

    def dev_accounts(self) -> list[DevAccount]:
        from eth_utils import to_checksum_address

        config = json.loads(self.accounts_file.read_text())
        return [DevAccount(to_checksum_address(address), key)
                for address, key in zip(config["available_accounts"], config["private_keys"], strict=True)]

    def stop(self) -> None:
        self.process.stop(timeout=15)


def load_artifact(path: Path = ARTIFACT) -> dict[str, Any]:
    """A compiled contract (abi + bytecode): the token by default. Built by `make install`; built
    here when missing (a test run outside `make`), with the same pinned solc-js."""
    if not path.exists():
        result = subprocess.run(["node", str(BASE_DIR / "contracts" / "compile.mjs"), str(path.parent)],
                                cwd=BASE_DIR, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"compiling contracts/*.sol failed (run `make install`): {result.stderr.strip()}")
    artifact: dict[str, Any] = json.loads(path.read_text())
    return artifact


def web3_for(rpc_url: str) -> Any:
    from web3 import HTTPProvider, Web3

    return Web3(HTTPProvider(rpc_url, request_kwargs={"timeout": 30}))


def _deploy(w3: Any, artifact: dict[str, Any], deployer: str, *args: Any) -> str:
    """Deploy a compiled contract from `deployer` (an unlocked Anvil account); its checksummed address."""
    factory = w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
    tx_hash = factory.constructor(*args).transact({"from": deployer})
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60, poll_latency=0.1)
    if receipt["status"] != 1:
        raise RuntimeError(f"deploying {artifact.get('contractName', 'the contract')} reverted")
    return str(receipt["contractAddress"])


def deploy_token(w3: Any, owner: str, name: str, artifact: dict[str, Any] | None = None) -> str:
    """Deploy one TestUSDC from `owner` (an unlocked Anvil account); its checksummed address."""
    return _deploy(w3, artifact or load_artifact(), owner, name)


def deploy_owner_wallet(w3: Any, deployer: str, owner: str) -> str:
    """Deploy one OwnerWallet (an EIP-1271 contract wallet controlled by `owner`'s key) from
    `deployer` (an unlocked Anvil account); its checksummed address."""
    return _deploy(w3, load_artifact(OWNER_WALLET_ARTIFACT), deployer, owner)


def mint(w3: Any, token: str, owner: str, recipients: list[str], amount: int) -> None:
    """Mint `amount` base units to each recipient; every mint sent before any is awaited."""
    contract = w3.eth.contract(address=token, abi=load_artifact()["abi"])
    hashes = [contract.functions.mint(recipient, amount).transact({"from": owner}) for recipient in recipients]
    for tx_hash in hashes:
        if w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60, poll_latency=0.1)["status"] != 1:
            raise RuntimeError("minting TestUSDC reverted")


@dataclass(frozen=True)
class DevChain:
    """What `make run` deployed; written to <data dir>/chain.json for settings and printed."""

    rpc_url: str
    chain_id: int
    usdc_contract: str
    treasury: str
    relayer_key: str
    demo_wallets: list[dict[str, str]]  # {address, private_key} — Anvil development keys

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def deploy_dev_chain(anvil: EmbeddedAnvil, *, previous: dict[str, Any] | None = None,
                     demo_wallets: int = 3, demo_usdc: int = 1000) -> tuple[DevChain, bool]:
    """Deploy the token and fund the demo wallets, unless `previous` (the last chain.json) names a
    token whose code is still on this node's (persisted) chain. Returns (chain, deployed now?)."""
    w3 = web3_for(anvil.url())
    accounts = anvil.dev_accounts()
    owner, treasury, relayer = accounts[OWNER_INDEX], accounts[TREASURY_INDEX], accounts[RELAYER_INDEX]
    demos = accounts[FIRST_DEMO_INDEX:FIRST_DEMO_INDEX + demo_wallets]
    token = (previous or {}).get("usdc_contract")
    deployed_now = not (token and len(w3.eth.get_code(token)) > 0)
    if deployed_now:
        token = deploy_token(w3, owner.address, TOKEN_NAME)
        mint(w3, token, owner.address, [demo.address for demo in demos], demo_usdc * 10**USDC_DECIMALS)
    chain = DevChain(
        rpc_url=anvil.url(), chain_id=DEV_CHAIN_ID, usdc_contract=str(token), treasury=treasury.address,
        relayer_key=relayer.key,
        demo_wallets=[{"address": demo.address, "private_key": demo.key} for demo in demos],
    )
    return chain, deployed_now


def chain_file(data: Path) -> Path:
    return data / "chain.json"


def read_chain_file(data: Path) -> dict[str, Any]:
    """The development chain `make run` recorded (or {}); settings use it when CHAIN_RPC_URL is
    unset. A file left by a runner that is gone is still read: its node then does not answer,
    and payments say 503 chain_unavailable rather than guess."""
    try:
        info = json.loads(chain_file(data).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def write_chain_file(data: Path, chain: DevChain) -> Path:
    path = chain_file(data)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(chain.to_json(), indent=2) + "\n")
    os.chmod(partial, 0o600)
    os.replace(partial, path)
    return path


def chain_lines(chain: DevChain) -> list[str]:
    """What `make run` prints about the development chain."""
    lines = [
        f"development chain: Anvil {chain.rpc_url} (chain id {chain.chain_id}), recorded in chain.json",
        f"  USDC (TestUSDC, 6 decimals)  {chain.usdc_contract}",
        f"  treasury                     {chain.treasury}",
        "  demo wallets (Anvil dev keys; import one into a browser wallet to pay):",
    ]
    lines += [f"    {wallet['address']}  key {wallet['private_key']}" for wallet in chain.demo_wallets]
    return lines


def run_dev_chain(data: Path, port: int, *, block_time: int) -> tuple[EmbeddedAnvil, DevChain, bool]:
    """Start the persisted development node under `data` and make sure the token is deployed."""
    anvil = EmbeddedAnvil(port, data_dir=data / "anvil", log_path=data / "logs" / "anvil.log",
                          block_time=block_time, persist=True)
    anvil.prepare()
    anvil.start()
    try:
        chain, deployed_now = deploy_dev_chain(anvil, previous=read_chain_file(data))
    except Exception:
        anvil.stop()
        raise
    return anvil, chain, deployed_now

