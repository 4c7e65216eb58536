"""mypy over the whole project, started when the session starts and read by tests/test_lint.py.

WHY: from a cold cache (every fresh clone, so every CI run) mypy takes about two minutes and needs
nothing from the test session. Started once the suite is collected, it type-checks beside the
other tests instead of adding its two minutes at the end (`pytest_collection_finish` in
tests/conftest.py starts it only when the mypy test was collected).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

BASE_DIR = Path(__file__).resolve().parent.parent
TEST_NAME = "test_mypy_finds_nothing"
_run: tuple[subprocess.Popen[bytes], IO[bytes]] | None = None


def start() -> None:
    global _run
    if _run is None:
        output = tempfile.NamedTemporaryFile(prefix="mypy-", suffix=".txt")  # noqa: SIM115 - read in result()
        mypy = Path(sys.executable).parent / "mypy"
        _run = (subprocess.Popen([str(mypy), "."], cwd=BASE_DIR, stdout=output, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL), output)


def result(timeout: float) -> tuple[int, str]:
    """mypy's exit code and output (started now if the session did not start it)."""
    start()
    assert _run is not None
    process, output = _run
    returncode = process.wait(timeout)
    output.seek(0)
    return returncode, output.read().decode(errors="replace")


def stop() -> None:
    """At the session's end: a run nobody read (the suite stopped early) does not outlive it."""
    if _run is not None and _run[0].poll() is None:
        _run[0].kill()
        _run[0].wait()
