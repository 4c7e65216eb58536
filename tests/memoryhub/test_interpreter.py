"""How CPython runs in our long-lived processes (memoryhub/interpreter.py): a web process and each
worker process freeze what they load for life out of the garbage collector's walks (a full collection
then walks what the process made since, not every object of its imports), and a web process
hands the GIL to a thread whose database answer came back within 1 ms, not CPython's 5.
`PYTHON_GC_TUNING=false` and `PYTHON_GIL_SWITCH_MS` change them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # each test starts interpreters

BASE_DIR = Path(__file__).resolve().parents[2]

_ENTRY_POINTS = {
    "web": "import memoryhub.asgi",  # what uvicorn imports in each web process
    # A worker's pool process runs worker_process_init's receivers once forked.
    "worker": "from memoryhub.celery import app; from celery.signals import worker_process_init; "
              "worker_process_init.send(sender=None)",
}
# What a fresh process reports: frozen objects, and the objects a full collection would walk.
_HEAP = "[gc.get_freeze_count(), len(gc.get_objects())]"
_SWITCH_INTERVAL = "sys.getswitchinterval()"


def _fresh_process(entry: str, report: str, **env: str) -> Any:
    """`report` (a Python expression) evaluated in a fresh process started as `entry` is."""
    code = f"{_ENTRY_POINTS[entry]}; import gc, json, sys; print(json.dumps({report}))"
    result = subprocess.run([sys.executable, "-c", code], cwd=BASE_DIR, env=dict(os.environ, **env),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("entry", "loaded"), [("web", 100_000), ("worker", 10_000)])
def test_a_started_process_leaves_what_it_loaded_out_of_full_collections(entry: str, loaded: int) -> None:
    frozen, walked = _fresh_process(entry, _HEAP)
    assert frozen > loaded  # Django, DRF and the rest, loaded for the process's life
    assert walked < frozen / 20  # a full collection walks a few percent of it at most


def test_turned_off_the_interpreter_walks_everything() -> None:
    frozen, walked = _fresh_process("web", _HEAP, PYTHON_GC_TUNING="false")
    assert frozen == 0
    assert walked > 100_000


def test_a_web_process_hands_the_gil_over_after_a_millisecond_unless_told_otherwise() -> None:
    assert _fresh_process("web", _SWITCH_INTERVAL) == 0.001
    assert _fresh_process("web", _SWITCH_INTERVAL, PYTHON_GIL_SWITCH_MS="5") == 0.005
