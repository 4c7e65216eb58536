"""Fixtures for driving the real, unmodified `kernle==0.15.0` CLI against a live MemoryHub.

Reusable by every end-to-end test in this folder:

* ``kernle_venv`` (session): a virtual environment with ``kernle==0.15.0`` and ``httpx==0.28.1``
  (httpx is required by the CLI but not declared by kernle). It is built once per machine at
  ``<repo>/var/kernle-venv-0.15.0`` under a file lock (parallel sessions wait for each other) and
  marked complete only after pip succeeded, so a half-built venv is rebuilt, never used.
* ``kernle_server`` (function): the base URL of pytest-django's ``live_server`` as
  ``http://localhost:PORT`` — the CLI sends credentials over plain http only to ``localhost`` or
  ``127.0.0.1`` (docs/kernle-protocol.md §1.4). Tests using it need
  ``@pytest.mark.django_db(transaction=True)`` so the server thread sees what they write.
* ``kernle`` (function): a :class:`KernleCLI`. ``kernle.new_data_dir()`` makes a fresh
  ``KERNLE_DATA_DIR`` (one "device"); ``kernle.run(*args, data_dir=..., stack="...")`` runs the CLI
  with that data dir, ``KERNLE_AUTO_SYNC=false``, no ``KERNLE_BACKEND_URL``/``KERNLE_AUTH_TOKEN``/
  ``KERNLE_USER_ID``, no proxies and a throw-away ``HOME``; it returns the ``CompletedProcess``
  (text stdout/stderr, never raises on a non-zero exit). ``kernle.json(result)`` parses a
  ``--json`` output, skipping any progress line printed before the JSON document.
  ``kernle.credentials(data_dir)`` reads the ``credentials.json`` the CLI wrote.
* throttle counters are emptied before each test by the suite-wide autouse fixture in
  tests/conftest.py, so per-IP limits (register 5/min …) do not leak between tests.

Example::

    @pytest.mark.django_db(transaction=True)
    def test_something(kernle, kernle_server):
        device = kernle.new_data_dir()
        done = kernle.run("auth", "register", "--email", "a@example.test",
                          "--backend-url", kernle_server, "--json", data_dir=device, stack="s1")
        assert done.returncode == 0, done.stdout + done.stderr
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# The browser fixtures and the screenshot-folder summary (tests/e2e/browser.py), for every module here.
from tests.e2e.browser import browser, dashboard_url, open_page, pytest_terminal_summary  # noqa: F401

BASE_DIR = Path(__file__).resolve().parent.parent.parent
KERNLE_VERSION = "0.15.0"
HTTPX_VERSION = "0.28.1"
VENV_DIR = BASE_DIR / "var" / f"kernle-venv-{KERNLE_VERSION}"
READY_MARKER = ".memoryhub-ready"


def _build_venv(venv: Path) -> None:
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "--quiet",
         f"kernle=={KERNLE_VERSION}", f"httpx=={HTTPX_VERSION}"],
        capture_output=True, text=True, timeout=900,
    )
    if pip.returncode != 0:
        raise RuntimeError(f"pip install kernle failed:\n{pip.stdout}\n{pip.stderr}")
    (venv / READY_MARKER).write_text(f"kernle=={KERNLE_VERSION} httpx=={HTTPX_VERSION}\n")


@pytest.fixture(scope="session")
def kernle_venv() -> Path:
    """The cached virtual environment holding the real kernle CLI (built on first use)."""
    VENV_DIR.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV_DIR.parent / f"kernle-venv-{KERNLE_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building it right now
        try:
            if not (VENV_DIR / READY_MARKER).exists() or not (VENV_DIR / "bin" / "kernle").exists():
                _build_venv(VENV_DIR)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return VENV_DIR


_JSON_START = re.compile(r"^[\[{]", re.M)


@dataclass
class KernleCLI:
    """Runs the real kernle CLI in isolated data directories ("devices")."""

    venv: Path
    tmp_root: Path
    _count: int = field(default=0)

    @property
    def executable(self) -> Path:
        return self.venv / "bin" / "kernle"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def new_data_dir(self) -> Path:
        self._count += 1
        path = self.tmp_root / f"device-{self._count}"
        path.mkdir(parents=True)
        return path

    def env(self, data_dir: Path, *, stack: str | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("KERNLE_") and k.lower() not in {"http_proxy", "https_proxy", "all_proxy"}}
        home = self.tmp_root / "home"
        home.mkdir(exist_ok=True)
        env.update(HOME=str(home), KERNLE_DATA_DIR=str(data_dir), KERNLE_AUTO_SYNC="false",
                   NO_PROXY="localhost,127.0.0.1", no_proxy="localhost,127.0.0.1", PYTHONUNBUFFERED="1")
        if stack is not None:
            env["KERNLE_STACK_ID"] = stack
        env.update(extra or {})
        return env

    def run(self, *args: str, data_dir: Path, stack: str | None = None, env: dict[str, str] | None = None,
            input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.executable), *args], env=self.env(data_dir, stack=stack, extra=env),
                              cwd=data_dir, input=input if input is not None else "", capture_output=True,
                              text=True, timeout=timeout)

    @staticmethod
    def json(result: subprocess.CompletedProcess[str]) -> Any:
        """The JSON document in a `--json` output (progress lines before it are skipped)."""
        match = _JSON_START.search(result.stdout)
        if match is None:
            raise AssertionError(f"no JSON in output:\n{result.stdout}\n{result.stderr}")
        return json.loads(result.stdout[match.start():])

    @staticmethod
    def credentials(data_dir: Path) -> dict[str, Any]:
        return json.loads((data_dir / "credentials.json").read_text())


@pytest.fixture
def kernle(kernle_venv: Path, tmp_path: Path) -> KernleCLI:
    return KernleCLI(venv=kernle_venv, tmp_root=tmp_path / "kernle")


@pytest.fixture
def kernle_server(live_server: Any) -> str:
    url = str(live_server.url)
    return url.replace("://127.0.0.1:", "://localhost:").rstrip("/")


