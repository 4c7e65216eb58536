"""The code stays lint- and type-clean: ruff (pinned, explicit rules), mypy with Django stubs, the
import-linter contracts that keep the layers (pyproject.toml) and vulture's dead-code check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # mypy and vulture over the tree (`make lint` runs them in the inner loop)

BASE_DIR = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PACKAGES = ("memoryhub", "accounts", "stacks", "billing", "teleport", "memories", "webhooks", "dashboard", "agents")


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([str(BIN / "ruff"), "check", "--output-format", "concise", "."], cwd=BASE_DIR,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:]


def test_mypy_finds_nothing() -> None:
    # `make lint` (which .ci/run calls first) leaves mypy's cache warm, so this re-check is quick.
    result = subprocess.run([str(BIN / "mypy"), "."], cwd=BASE_DIR, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-5000:]


def lint_imports(cwd: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """`lint-imports` over the packages found in `cwd` (and nowhere else), for the given contracts."""
    argv = [str(BIN / "lint-imports"), "--no-cache", "--no-logo"]
    for contract in contracts:
        argv += ["--contract", contract]
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_import_contracts_hold() -> None:
    result = lint_imports(BASE_DIR)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_vulture_finds_no_dead_code() -> None:
    result = subprocess.run([str(BIN / "vulture")], cwd=BASE_DIR, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """The apps' Python sources and the contracts, copied where a test may break them."""
    for package in PACKAGES:
        shutil.copytree(BASE_DIR / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.html", "*.md"))
    shutil.copy(BASE_DIR / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


# One deliberate break per rule: (contract id, files added to the copied tree, what lint-imports says).
BREAKS = {
    "accounts-imports-memories": ("layers", {"accounts/upward.py": "from memories import models\n"},
                                  "accounts is not allowed to import memories"),
    "stacks-imports-billing": ("layers", {"stacks/upward.py": "from billing import entitlements\n"},
                               "stacks is not allowed to import billing"),
    "project-imports-an-app": ("layers", {"memoryhub/upward.py": "import memories.models\n"},
                               "memoryhub is not allowed to import memories"),
    "memories-past-entitlements": ("billing-door",
                                   {"billing/plans.py": "", "memories/sneaky.py": "from billing import plans\n"},
                                   "memories is not allowed to import billing"),
    "a-module-imports-an-api": ("entry-points", {"stacks/helpers.py": "from accounts import api\n"},
                                "Illegal imports of protected package accounts.api"),
    "a-cycle": ("acyclic",
                {"stacks/cycle.py": "import stacks.cycle_back\n", "stacks/cycle_back.py": "import stacks.cycle\n"},
                "No cycles are allowed in stacks"),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_a_deliberate_break_makes_its_contract_fail(tree_copy: Path, case: str) -> None:
    """Each contract bites: one added import in a copy of the tree makes lint-imports fail, naming it."""
    contract, files, complaint = BREAKS[case]
    before = lint_imports(tree_copy, contract)
    assert complaint not in before.stdout, before.stdout[-3000:]
    for path, source in files.items():
        (tree_copy / path).write_text(source)
    after = lint_imports(tree_copy, contract)
    assert after.returncode != 0
    assert complaint in after.stdout, after.stdout[-3000:]
