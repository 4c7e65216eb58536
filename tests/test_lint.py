"""The code stays lint- and type-clean: ruff (pinned, explicit rules) and mypy with Django stubs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([str(BIN / "ruff"), "check", "--output-format", "concise", "."], cwd=BASE_DIR,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:]


def test_mypy_finds_nothing() -> None:
    result = subprocess.run([str(BIN / "mypy"), "."], cwd=BASE_DIR, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-5000:]
