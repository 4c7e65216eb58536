"""Payment verification on a real EVM: confirm-check latency and treasury-watcher throughput.

    .venv/bin/python bench/payments.py                          # 200 confirm checks, 10,000 treasury transfers
    .venv/bin/python bench/payments.py --checks 50 --transfers 1000   # a quick run

One embedded Anvil node (memoryhub/chain_dev.py) with the compiled TestUSDC; billing/chain/ is
pointed at it exactly as settings point it at Base in production (HTTP JSON-RPC, no shortcut).

* confirm check: `inspect_transfer` (the full rule set: chain id, receipt, the USDC Transfer log,
  treasury, exact amount, linked sender, block time, confirmations) over `--checks` real,
  confirmed transfers, interleaved with the baseline — a bare `eth_getTransactionReceipt` of the
  same transaction through the same web3 client — so both see the same noise;
* watcher: `--transfers` USDC transfers into the treasury (plus one in ten elsewhere and one in
  ten of a look-alike token, which the scan must skip) from 15 payers, mined ~200 per block; then
  `treasury_transfers` over the whole range in CHAIN_LOG_RANGE-block eth_getLogs calls and the
  match of every transfer to an open intent (sender, exact amount) — transfers/s; baseline: one
  bare eth_getLogs of the same range and filter, undecoded.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eth_typing import HexStr

from bench.harness import log, percentiles, print_table
from memoryhub.chain_dev import (
    LOOKALIKE_NAME,
    OWNER_INDEX,
    TOKEN_NAME,
    TREASURY_INDEX,
    EmbeddedAnvil,
    deploy_token,
    mint,
    rpc_call,
    web3_for,
)
from memoryhub.embedded import free_port

USDC = 10**6
PRICE = 5 * USDC
CONFIRMATIONS = 10
TRANSFER_SELECTOR = "0xa9059cbb"  # transfer(address,uint256)


def transfer_call(token: str, sender: str, to: str, amount: int) -> dict[str, str]:
    data = TRANSFER_SELECTOR + to[2:].lower().rjust(64, "0") + hex(amount)[2:].rjust(64, "0")
    # An explicit gas limit: no eth_estimateGas round trip per transaction while loading.
    return {"from": sender, "to": token, "data": data, "gas": hex(100_000), "gasPrice": hex(2 * 10**9)}


def load_transfers(url: str, calls: list[dict[str, str]], per_block: int = 200) -> list[str]:
    """Send every call (automine off), mining a block every `per_block`; their hashes."""
    import requests

    session = requests.Session()
    hashes: list[str] = []
    # Explicit nonces: a JSON-RPC batch is not sent in order, so the node cannot pick them.
    nonces = {sender: int(rpc_call(url, "eth_getTransactionCount", [sender, "pending"]), 16)
              for sender in {call["from"] for call in calls}}
    for call in calls:
        call["nonce"] = hex(nonces[call["from"]])
        nonces[call["from"]] += 1
    rpc_call(url, "evm_setAutomine", [False])
    try:
        for start in range(0, len(calls), per_block):
            batch = [{"jsonrpc": "2.0", "id": i, "method": "eth_sendTransaction", "params": [call]}
                     for i, call in enumerate(calls[start:start + per_block])]
            answers = sorted(session.post(url, json=batch, timeout=120).json(), key=lambda a: a["id"])
            errors = [a["error"] for a in answers if "error" in a]
            if errors:
                raise RuntimeError(f"sending transfers failed: {errors[0]}")
            hashes += [a["result"] for a in answers]
            rpc_call(url, "anvil_mine", ["0x1"], timeout=120)
    finally:
        rpc_call(url, "evm_setAutomine", [True])
    return hashes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checks", type=int, default=200, help="confirm checks measured (default 200)")
    parser.add_argument("--transfers", type=int, default=10_000, help="treasury transfers scanned (default 10,000)")
    parser.add_argument("--log-range", type=int, default=2000, help="blocks per eth_getLogs (CHAIN_LOG_RANGE)")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="memoryhub-bench-payments-"))
    anvil = EmbeddedAnvil(free_port(), data_dir=workdir / "anvil", log_path=workdir / "anvil.log", accounts=20)
    anvil.prepare()
    anvil.start()
    try:
        w3 = web3_for(anvil.url())
        accounts = anvil.dev_accounts()
        owner, treasury = accounts[OWNER_INDEX], accounts[TREASURY_INDEX]
        payers = accounts[5:]
        usdc = deploy_token(w3, owner.address, TOKEN_NAME)
        lookalike = deploy_token(w3, owner.address, LOOKALIKE_NAME)
        for token in (usdc, lookalike):
            mint(w3, token, owner.address, [p.address for p in payers], 10**9 * USDC)
        os.environ.update({
            "MEMORYHUB_DATA_DIR": str(workdir), "DJANGO_SETTINGS_MODULE": "memoryhub.settings",
            "CHAIN_RPC_URL": anvil.url(), "CHAIN_ID": "31337", "USDC_CONTRACT": usdc,
            "TREASURY_ADDRESS": treasury.address, "PAYMENT_CONFIRMATIONS": str(CONFIRMATIONS),
            "CHAIN_LOG_RANGE": str(args.log_range), "CHAIN_EXPLORER_URL": "",
            "DB_POOL_MAX_SIZE": "0",  # no database is used: open no pool at start-up
        })
        import django

        django.setup()
        from billing.chain.node import TRANSFER_TOPIC, chain_config, web3_client
        from billing.chain.transfers import inspect_transfer, treasury_transfers

        log(f"confirm checks: sending {args.checks} transfers of 5 USDC to the treasury")
        linked = {p.address for p in payers}
        since = datetime.fromtimestamp(0, tz=UTC)
        check_hashes = load_transfers(anvil.url(), [
            transfer_call(usdc, payers[i % len(payers)].address, treasury.address, PRICE) for i in range(args.checks)])
        rpc_call(anvil.url(), "anvil_mine", [hex(CONFIRMATIONS)])
        full: list[float] = []
        bare: list[float] = []
        client = web3_client(chain_config())
        for tx_hash in check_hashes:
            started = time.perf_counter()
            client.eth.get_transaction_receipt(HexStr(tx_hash))
            bare.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            check = inspect_transfer(tx_hash, expected_amount=PRICE, expected_from=linked, not_before=since)
            full.append((time.perf_counter() - started) * 1000)
            if check.status != "confirmed":
                raise RuntimeError(f"expected a confirmed transfer, got {check.status} {check.reason}")
        f, b = percentiles(full), percentiles(bare)
        print_table("confirm check (ms)", [
            {"what": "inspect_transfer (full check)", "n": f["n"], "p50": f["p50"], "p95": f["p95"], "p99": f["p99"]},
            {"what": "bare eth_getTransactionReceipt", "n": b["n"], "p50": b["p50"], "p95": b["p95"], "p99": b["p99"]},
        ])

        log(f"watcher: sending {args.transfers} treasury transfers (+ noise)")
        start_block = int(w3.eth.block_number) + 1
        calls: list[dict[str, str]] = []
        expected: dict[tuple[str, int], int] = {}  # open intents: (sender, amount) -> intent number
        for i in range(args.transfers):
            sender = payers[i % len(payers)].address
            amount = PRICE + i  # per-intent amounts, so each transfer matches exactly one intent
            calls.append(transfer_call(usdc, sender, treasury.address, amount))
            expected[(sender, amount)] = i
            if i % 10 == 0:
                calls.append(transfer_call(usdc, sender, owner.address, amount))  # not to the treasury
                calls.append(transfer_call(lookalike, sender, treasury.address, amount))  # not USDC
        load_started = time.perf_counter()
        load_transfers(anvil.url(), calls)
        end_block = int(w3.eth.block_number)
        log(f"loaded {len(calls)} transactions in {end_block - start_block + 1} blocks "
            f"({time.perf_counter() - load_started:.1f}s)")

        started = time.perf_counter()
        found = treasury_transfers(start_block, end_block)
        matched = sum(1 for t in found if (t.sender, t.amount) in expected)
        scan_seconds = time.perf_counter() - started
        if len(found) != args.transfers or matched != args.transfers:
            raise RuntimeError(f"scan found {len(found)} transfers, matched {matched}; expected {args.transfers}")
        treasury_topic = "0x" + "00" * 12 + treasury.address[2:].lower()
        started = time.perf_counter()
        raw: Any = rpc_call(anvil.url(), "eth_getLogs", [{
            "fromBlock": hex(start_block), "toBlock": hex(end_block), "address": usdc,
            "topics": [TRANSFER_TOPIC, None, treasury_topic]}], timeout=300)
        bare_seconds = time.perf_counter() - started
        print_table(f"watcher over {args.transfers:,} treasury transfers", [
            {"what": f"treasury_transfers + match (CHAIN_LOG_RANGE {args.log_range})", "seconds": scan_seconds,
             "transfers_per_s": args.transfers / scan_seconds},
            {"what": "bare eth_getLogs, one call, undecoded", "seconds": bare_seconds,
             "transfers_per_s": len(raw) / bare_seconds},
        ])
    finally:
        anvil.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
