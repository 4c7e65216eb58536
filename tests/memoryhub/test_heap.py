"""A web process and each worker process freeze what they load for life out of the garbage
collector's walks (memoryhub/heap.py): a full collection then walks what the process made since,
not the ~300,000 objects of its imports. `PYTHON_GC_TUNING=false` leaves the interpreter as it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BASE_DIR = Path(__file__).resolve().parents[2]

# What a fresh process reports: frozen objects, and the objects a full collection would walk.
_REPORT = "import gc, json; print(json.dumps([gc.get_freeze_count(), len(gc.get_objects())]))"
_ENTRY_POINTS = {
    "web": "import memoryhub.asgi",  # what uvicorn imports in each web process
    # A worker's pool process runs worker_process_init's receivers once forked.
    "worker": "from memoryhub.celery import app; from celery.signals import worker_process_init; "
              "worker_process_init.send(sender=None)",
}


def _heap_after(entry: str, **env: str) -> tuple[int, int]:
    result = subprocess.run([sys.executable, "-c", f"{_ENTRY_POINTS[entry]}; {_REPORT}"], cwd=BASE_DIR,
                            env=dict(os.environ, **env), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    frozen, walked = json.loads(result.stdout.strip().splitlines()[-1])
    return frozen, walked


@pytest.mark.parametrize(("entry", "loaded"), [("web", 100_000), ("worker", 10_000)])
def test_a_started_process_leaves_what_it_loaded_out_of_full_collections(entry: str, loaded: int) -> None:
    frozen, walked = _heap_after(entry)
    assert frozen > loaded  # Django, DRF and the rest, loaded for the process's life
    assert walked < frozen / 20  # a full collection walks a few percent of it at most


def test_turned_off_the_interpreter_walks_everything() -> None:
    frozen, walked = _heap_after("web", PYTHON_GC_TUNING="false")
    assert frozen == 0
    assert walked > 100_000
