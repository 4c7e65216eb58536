"""A real development chain for the billing tests: one Anvil node per test session, with the
compiled TestUSDC deployed twice — the configured token and a look-alike (same code, same
events, another address) — and funded payer accounts.

`DevChain` is what tests touch: accounts with their keys, `send_usdc`, `mine`, `snapshot`/`revert`
(also how a reorg is made), contract wallets (`deploy_wallet`: contracts/OwnerWallet.sol, EIP-1271,
and `send_usdc_from_wallet`), and the settings that point billing/chain/ at this node. The
`chain` fixture (tests/billing/conftest.py) reverts every test's blocks when it ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.test import override_settings

from memoryhub.chain_dev import (
    LOOKALIKE_NAME,
    OWNER_INDEX,
    OWNER_WALLET_ARTIFACT,
    RELAYER_INDEX,
    TOKEN_NAME,
    TREASURY_INDEX,
    USDC_DECIMALS,
    DevAccount,
    EmbeddedAnvil,
    deploy_owner_wallet,
    deploy_token,
    load_artifact,
    mint,
    rpc_call,
    web3_for,
)
from memoryhub.embedded import free_port

USDC = 10**USDC_DECIMALS  # one USDC in base units
PAYER_FUNDS = 1_000_000 * USDC
FIRST_PAYER_INDEX = 3
ACCOUNTS = 20


@dataclass
class DevChain:
    anvil: EmbeddedAnvil
    w3: Any
    usdc: str
    lookalike: str
    owner: DevAccount
    treasury: DevAccount
    relayer: DevAccount
    accounts: list[DevAccount]  # payers, each holding PAYER_FUNDS of both tokens
    confirmations: int = 10

    @property
    def rpc_url(self) -> str:
        return self.anvil.url()

    def rpc(self, method: str, *params: Any) -> Any:
        return rpc_call(self.rpc_url, method, list(params), timeout=30)

    def settings(self, **overrides: Any) -> Any:
        """override_settings pointing billing/chain/ at this node (use as a context manager)."""
        values = {"CHAIN_RPC_URL": self.rpc_url, "CHAIN_ID": 31337, "USDC_CONTRACT": self.usdc,
                  "TREASURY_ADDRESS": self.treasury.address, "PAYMENT_CONFIRMATIONS": self.confirmations,
                  "CHAIN_RELAYER_KEY": self.relayer.key, "CHAIN_LOG_RANGE": 2000, "CHAIN_RPC_TIMEOUT_SECONDS": 10,
                  "CHAIN_EXPLORER_URL": ""}
        values.update(overrides)
        return override_settings(**values)

    def token(self, address: str | None = None) -> Any:
        return self.w3.eth.contract(address=address or self.usdc, abi=load_artifact()["abi"])

    def send_usdc(self, sender: DevAccount | str, to: str, amount: int, *, token: str | None = None,
                  gas: int | None = None) -> str:
        """Transfer `amount` base units (mined at once); the tx hash, 0x lowercase. Pass `gas` to
        send even a transfer that will revert (no estimate first), to get a failed receipt."""
        address = sender if isinstance(sender, str) else sender.address
        options: dict[str, Any] = {"from": address}
        if gas is not None:
            options["gas"] = gas
        tx_hash = self.token(token).functions.transfer(to, amount).transact(options)
        self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=30, poll_latency=0.05)
        return str(tx_hash.to_0x_hex())

    def deploy_wallet(self, owner: DevAccount) -> str:
        """A new OwnerWallet (contracts/OwnerWallet.sol): a contract wallet that accepts what
        `owner`'s key signs (EIP-1271) and moves funds only at its owner's call."""
        return deploy_owner_wallet(self.w3, self.owner.address, owner.address)

    def send_usdc_from_wallet(self, wallet: str, owner: DevAccount, to: str, amount: int) -> str:
        """The contract wallet pays: its owner has it call USDC `transfer`, so the Transfer log's
        sender is the wallet's address (mined at once); the tx hash, 0x lowercase."""
        data = self.token().encode_abi("transfer", args=[to, amount])
        contract = self.w3.eth.contract(address=wallet, abi=load_artifact(OWNER_WALLET_ARTIFACT)["abi"])
        tx_hash = contract.functions.execute(self.usdc, 0, data).transact({"from": owner.address})
        if self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=30, poll_latency=0.05)["status"] != 1:
            raise RuntimeError("the contract wallet's transfer reverted")
        return str(tx_hash.to_0x_hex())

    def balance(self, address: str, *, token: str | None = None) -> int:
        return int(self.token(token).functions.balanceOf(address).call())

    def mine(self, blocks: int = 1) -> None:
        self.rpc("anvil_mine", hex(blocks))

    def confirm(self) -> None:
        """Mine until a transaction in the latest block has exactly the required confirmations."""
        self.mine(self.confirmations - 1)

    def head(self) -> int:
        return int(self.rpc("eth_blockNumber"), 16)

    def block_time(self, number: int) -> datetime:
        return datetime.fromtimestamp(int(self.rpc("eth_getBlockByNumber", hex(number), False)["timestamp"], 16), UTC)

    def snapshot(self) -> str:
        return str(self.rpc("evm_snapshot"))

    def revert(self, snapshot_id: str) -> None:
        if not self.rpc("evm_revert", snapshot_id):
            raise RuntimeError(f"anvil could not revert to snapshot {snapshot_id}")


def start_dev_chain(data_dir: Path, *, log_path: Path | None = None) -> DevChain:
    anvil = EmbeddedAnvil(free_port(), data_dir=data_dir, log_path=log_path, accounts=ACCOUNTS)
    anvil.prepare()
    anvil.start()
    try:
        w3 = web3_for(anvil.url())
        accounts = anvil.dev_accounts()
        owner = accounts[OWNER_INDEX]
        usdc = deploy_token(w3, owner.address, TOKEN_NAME)
        lookalike = deploy_token(w3, owner.address, LOOKALIKE_NAME)
        payers = accounts[FIRST_PAYER_INDEX:]
        for token in (usdc, lookalike):
            mint(w3, token, owner.address, [payer.address for payer in payers], PAYER_FUNDS)
    except Exception:
        anvil.stop()
        raise
    return DevChain(anvil=anvil, w3=w3, usdc=usdc, lookalike=lookalike, owner=owner,
                    treasury=accounts[TREASURY_INDEX], relayer=accounts[RELAYER_INDEX], accounts=payers)

