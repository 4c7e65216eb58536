"""A web process hands the GIL to a thread whose database answer came back within 1 ms, not
CPython's 5 (memoryhub/gil.py); `PYTHON_GIL_SWITCH_MS` sets it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]


def _web_process_switch_interval(**env: str) -> float:
    """What a fresh web process (what uvicorn imports) runs with, in seconds."""
    result = subprocess.run([sys.executable, "-c", "import sys, memoryhub.asgi; print(sys.getswitchinterval())"],
                            cwd=BASE_DIR, env=dict(os.environ, **env), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return float(result.stdout.strip().splitlines()[-1])


def test_a_web_process_hands_the_gil_over_after_a_millisecond_unless_told_otherwise() -> None:
    assert _web_process_switch_interval() == 0.001
    assert _web_process_switch_interval(PYTHON_GIL_SWITCH_MS="5") == 0.005
