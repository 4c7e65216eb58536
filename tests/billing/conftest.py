"""Billing fixtures. The Anvil node starts only when a test asks for `chain` (or `dev_chain_node`),
so the rest of the suite never pays for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.billing.chain import DevChain, start_dev_chain


@pytest.fixture(scope="session")
def dev_chain_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevChain]:
    """One Anvil node for the session: TestUSDC and a look-alike deployed, payers funded."""
    data_dir = tmp_path_factory.mktemp("anvil")
    node = start_dev_chain(data_dir, log_path=data_dir / "anvil.log")
    yield node
    node.anvil.stop()


@pytest.fixture
def chain(dev_chain_node: DevChain) -> Iterator[DevChain]:
    """The session's chain with billing settings pointing at it; every block the test mines or
    transaction it sends is reverted when it ends (Anvil snapshot), so tests do not see each other."""
    snapshot = dev_chain_node.snapshot()
    try:
        with dev_chain_node.settings():
            yield dev_chain_node
    finally:
        dev_chain_node.revert(snapshot)
