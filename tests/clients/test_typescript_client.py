"""The TypeScript client (clients/typescript, `@memoryhub/client`) against a live MemoryHub.

Node's own test runner runs clients/typescript/test/ — an agent's scenario through the built
client and the schema-drift check — against pytest-django's `live_server` on the test database.
This module makes what the scenario needs: a school with a stack, its agent key and a school key,
and another school's stack. Memories become searchable by meaning the way the service makes them
so: a background embedder (here a thread, with the real MiniLM model) writes their vectors after
the write was answered. Native sync push is limited to one request a second, so the scenario can
meet a 429 and see the client wait for its Retry-After (clients/typescript/README.md).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from memories.models import Memory
from memories.search.embedding_jobs import memories_embed
from memories.search.embedding_model import deployment_model_switch
from memories.search.embeddings import get_embedder
from tests.factories import make_key, make_org, make_stack

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CLIENT_DIR = Path(__file__).resolve().parent.parent.parent / "clients" / "typescript"
NODE_TESTS = ["test/scenario.test.mjs", "test/transport.test.mjs", "test/schema-drift.test.mjs"]
README = CLIENT_DIR.parent.parent / "README.md"


def _readme_snippet() -> str:
    """The TypeScript example in the README's "Connect your agent"."""
    match = re.search(r"^\* \*\*TypeScript\*\*.*?^  ```js\n(.*?)^  ```", README.read_text(), re.S | re.M)
    assert match, "README.md's Connect your agent has no TypeScript example"
    return "\n".join(line.removeprefix("  ") for line in match.group(1).splitlines())


def _npm(*args: str) -> None:
    done = subprocess.run(["npm", *args], cwd=CLIENT_DIR, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def _built_client() -> None:
    """dist/ as `make install` builds it; installed and built here when missing or older than a
    source (an edit not yet built), so the test never runs a stale client. Then the type checks
    (test/types.check.ts)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node is missing: install Node.js 20 (with npm) and run `make install`")
    if not (CLIENT_DIR / "node_modules" / ".bin" / "tsc").exists():
        _npm("ci", "--no-audit", "--no-fund", "--loglevel=error")
    built = CLIENT_DIR / "dist" / "index.js"
    sources = [*CLIENT_DIR.glob("src/*.ts"), CLIENT_DIR / "package.json", CLIENT_DIR / "tsconfig.json"]
    if not built.exists() or max(p.stat().st_mtime for p in sources) > built.stat().st_mtime:
        _npm("run", "build")
    _npm("run", "typecheck")  # the calls as documented compile; what the schema rules out does not


@pytest.fixture
def minilm(settings: Any) -> Any:
    """The deployment embeds with the real model (the suite's `hash` one knows words, not meaning)."""
    settings.EMBEDDING_PROVIDER = "minilm"
    embedder = get_embedder()
    deployment_model_switch(embedder.model_id)
    return embedder


@pytest.fixture
def background_embedder(minilm: Any) -> Iterator[None]:
    """Stores the vectors of memories awaiting one, a few times a second, as the worker would."""
    stop = threading.Event()

    def run() -> None:
        try:
            while not stop.wait(0.2):
                pending = list(Memory.objects.filter(embedded_version__isnull=True).values_list("pk", flat=True))
                if pending:
                    memories_embed(ids=pending, embedder=minilm)
        finally:
            connection.close()

    thread = threading.Thread(target=run, name="test-embedder", daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=30)


@pytest.mark.usefixtures("background_embedder")
def test_typescript_client_scenario_and_schema(live_server: Any, settings: Any) -> None:
    _built_client()
    rates = {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "sync_push": "1/s"}
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}

    school = make_org("Client School")
    ada = make_stack(school, "ada")
    _, agent_secret = make_key(school, stack=ada, name="ada's tutor")
    _, school_secret = make_key(school, name="school system")
    other = make_stack(make_org("Other School"), "zed")

    env = {key: value for key, value in os.environ.items() if key.lower() not in {"http_proxy", "https_proxy"}}
    env.update(MEMORYHUB_URL=str(live_server.url).rstrip("/"), MEMORYHUB_KEY=agent_secret,
               MEMORYHUB_SCHOOL_KEY=school_secret, MEMORYHUB_STACK=ada.slug, MEMORYHUB_OTHER_STACK=other.slug,
               MEMORYHUB_THROTTLED="sync_push", NO_PROXY="127.0.0.1,localhost", NODE_NO_WARNINGS="1")
    done = subprocess.run(["node", "--test", "--test-reporter=spec", *NODE_TESTS], cwd=CLIENT_DIR, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
    assert "fail 0" in done.stdout, done.stdout

    # The README's example, as a reader would run it (inside the package, "@memoryhub/client" is
    # the package itself), after the scenario: the stack has memories to find.
    snippet = CLIENT_DIR / "dist" / "readme-snippet.mjs"
    snippet.write_text(_readme_snippet())
    done = subprocess.run(["node", str(snippet)], cwd=CLIENT_DIR, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pizza" in done.stdout and "budget_used" in done.stdout, done.stdout
