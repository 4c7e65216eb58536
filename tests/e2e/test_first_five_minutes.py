"""The README's "First five minutes", run as written: a newcomer's shell lines, read from README.md,
against a live MemoryHub with a fresh data directory and the real kernle 0.15.0 CLI.

What stands in for what the README does by hand, and nothing else:

* `make run` (terminal 1) is pytest-django's live server on the test database; the `manage.py`
  lines reach it the way they reach `make run`'s (DATABASE_URL, the fresh MEMORYHUB_DATA_DIR, and
  HOST/PORT of the server, which is what `create_school` prints in its `export` line);
* `python3 -m venv /tmp/k && /tmp/k/bin/pip install …` is the cached kernle venv of the e2e fixtures
  (same pinned versions, checked), so `/tmp/k/bin/` becomes that venv's `bin/`;
* the line the README says to paste (`export … knl_sk_…`) is the line `create_school` printed.

Every other line runs verbatim in bash (`set -eo pipefail`), in order, with a throw-away HOME, no
KERNLE_* variables and no proxy; a failing line is named in the assertion message. The dashboard
step signs in over HTTP with the password `create_school` printed. The "With the real kernle CLI"
block (personal accounts) runs the same way, its `--backend-url` pointed at the live server.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from django.conf import global_settings

from memories.models import Memory
from stacks.models import Stack
from tests.e2e.conftest import HTTPX_VERSION, KERNLE_VERSION
from tests.factories import database_url_for_processes

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BASE_DIR = Path(__file__).resolve().parent.parent.parent
PASTE = "knl_sk_…"  # the README's placeholder for the key a command printed
VENV_LINE = "python3 -m venv /tmp/k && /tmp/k/bin/pip install "


def readme_blocks(section: str) -> list[list[str]]:
    """The ```bash blocks of a README section, each as its commands (continuations joined,
    blank and comment-only lines dropped)."""
    text = (BASE_DIR / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1]
    body = re.split(r"\n## ", body, maxsplit=1)[0]
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", body, re.S):
        commands: list[str] = []
        pending = ""
        for line in block.splitlines():
            pending += line.rstrip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            if pending.strip() and not pending.lstrip().startswith("#"):
                commands.append(pending.strip())
            pending = ""
        blocks.append(commands)
    return blocks


class Shell:
    """Runs README commands the way a newcomer's second terminal does."""

    def __init__(self, tmp_path: Path, venv: Path, server_url: str) -> None:
        self.venv = venv
        url = urlsplit(server_url)
        home = tmp_path / "home"
        data = tmp_path / "memoryhub-data"  # a fresh MEMORYHUB_DATA_DIR: no runtime file of another run
        home.mkdir()
        data.mkdir()
        # The suite's own variables stay (MEMORYHUB_TEST_SUITE: the server and these commands share
        # the suite's secrets, as `make run` and `manage.py` share DATA_DIR/secrets.json).
        self.env = {name: value for name, value in os.environ.items()
                    if not name.startswith("KERNLE_") and name not in ("MEMORYHUB_URL", "MEMORYHUB_KEY")
                    and name.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
        self.env.update(HOME=str(home), MEMORYHUB_DATA_DIR=str(data), DATABASE_URL=database_url_for_processes(),
                        HOST=url.hostname or "127.0.0.1", PORT=str(url.port), NO_PROXY="localhost,127.0.0.1",
                        no_proxy="localhost,127.0.0.1", PYTHONUNBUFFERED="1")

    def command(self, line: str) -> str | None:
        """The line as it runs here, or None for the venv line (the fixture's venv stands in)."""
        if line.startswith(VENV_LINE):
            assert f"kernle=={KERNLE_VERSION}" in line and f"httpx=={HTTPX_VERSION}" in line, line
            return None
        assert "make run" not in line
        return line.replace("/tmp/k/bin/", f"{self.venv}/bin/")

    def run(self, lines: list[str]) -> subprocess.CompletedProcess[str]:
        script = ["set -eo pipefail"]
        for line in lines:
            script += [f"echo {_quote('::: ' + line)} >&2", line]
        return subprocess.run(["bash", "-c", "\n".join(script)], env=self.env, cwd=BASE_DIR, capture_output=True,
                              text=True, timeout=600)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def _explain(done: subprocess.CompletedProcess[str]) -> str:
    ran = [line[4:] for line in done.stderr.splitlines() if line.startswith("::: ")]
    return (f"exit {done.returncode} at README line: {ran[-1] if ran else '?'}\n"
            f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}")


def test_first_five_minutes_as_written(kernle_venv: Path, live_server: Any, tmp_path: Path, settings: Any) -> None:
    # `create_school` runs as a process with the real password hashers; the suite swaps in a fast one.
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    terminal_1, terminal_2 = readme_blocks("First five minutes")
    assert terminal_1 == ["make run    # leave it running; it prints \"MemoryHub is up\" and its URLs"]
    shell = Shell(tmp_path, kernle_venv, live_server.url)
    lines = [command for line in terminal_2 if (command := shell.command(line)) is not None]
    paste = next(i for i, line in enumerate(lines) if PASTE in line)

    # Up to the line to paste: create the school (and print its admin's password and key).
    created = shell.run(lines[:paste])
    assert created.returncode == 0, _explain(created)
    password = re.search(r"password:\s+(\S+)", created.stdout).group(1)  # type: ignore[union-attr]
    printed = [line.strip() for line in created.stdout.splitlines()
               if line.strip().startswith(lines[paste].split("=", 1)[0] + "=")]
    assert len(printed) == 1, created.stdout
    assert printed[0].startswith(f"export MEMORYHUB_URL={live_server.url} MEMORYHUB_KEY=knl_sk_")

    # The rest, with the printed line pasted where the README says.
    done = shell.run([printed[0], *lines[paste + 1:]])
    assert done.returncode == 0, _explain(done)
    assert '"stack_id":"ada"' in done.stdout.replace(" ", "")  # the stack the curl line created
    assert "Fractions click with pizza diagrams" in done.stdout  # kernle search, then the API's search
    assert done.stdout.count("Fractions click with pizza diagrams") >= 2, done.stdout

    stack = Stack.objects.get(slug="ada", organization__slug="hill-school")
    # The note, citing the raw entry it came from (raw entries themselves stay on the device).
    note = Memory.objects.get(stack=stack)
    assert (note.kind, note.text) == ("note", "Fractions click with pizza diagrams")
    assert len(note.derived_from) == 1 and note.derived_from[0].startswith("raw:")

    # The dashboard, signed in with the printed password.
    browser = requests.Session()
    login = browser.get(f"{live_server.url}/login/", timeout=30, proxies={"http": "", "https": ""})
    assert login.status_code == 200
    dashboard = browser.post(f"{live_server.url}/login/", timeout=30, proxies={"http": "", "https": ""}, data={
        "username": "admin@hill.example", "password": password, "next": "/dashboard/",
        "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
    assert dashboard.status_code == 200 and dashboard.url.endswith("/dashboard/"), dashboard.text[:500]
    row = re.search(r'<tr data-stack="ada">(.*?)</tr>', dashboard.text, re.S)
    assert row is not None, dashboard.text
    cells = [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)]
    # The student (the name, linking to the page, with the slug beside it), teachers, status, memories.
    assert re.split(r"\s+", cells[0]) == ["Ada", "ada"] and cells[3] == "1", cells
    assert re.search(r'<a href="/dashboard/students/ada/">Ada</a>', row.group(1)), row.group(1)


def test_the_kernle_register_lines_as_written(kernle_venv: Path, live_server: Any, tmp_path: Path) -> None:
    [block] = readme_blocks("Trying it")[1:]
    shell = Shell(tmp_path, kernle_venv, live_server.url)
    lines = [command for line in block if (command := shell.command(line)) is not None]
    lines = [line.replace("http://127.0.0.1:8000", live_server.url) for line in lines]  # where `make run` listens
    done = shell.run(lines)
    assert done.returncode == 0, _explain(done)
    assert "Pizza diagrams work for fractions" in done.stdout
    stack = Stack.objects.get(slug="my-agent")
    assert list(Memory.objects.filter(stack=stack).values_list("kind", flat=True)) == ["note"]
