"""A student's page updates live in real Chromium while the real kernle CLI writes (docs/architecture.md
§10, "Live pages").

pytest-django's `live_server` speaks WSGI only, so the page here is served by the real ASGI app
under uvicorn (as `make run` serves it) on the test database and Redis: HTTP and the page's
websocket alike. An admin has the page open; the CLI pushes three notes and one is forgotten
through the native API with the same key; the page shows all of it within 2 s without a reload.
Then the page's socket is dropped, and later the server itself is stopped, while a memory is
written: after the reconnect the memory is on the page exactly once.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from playwright.sync_api import Page

from accounts.models import Membership, User
from memories.models import Memory
from memories.services import memory_create
from memoryhub.embedded import ManagedProcess, free_port
from stacks.models import Stack
from tests.e2e.agent import agent_signed_in, cli_output
from tests.e2e.browser import WatchedPage, check_page, sign_in
from tests.e2e.conftest import KernleCLI
from tests.factories import database_url_for_processes, make_key, make_org, make_stack, make_user, wait_for_health

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BASE_DIR = Path(__file__).resolve().parents[2]
PASSWORD = "correct horse battery staple"  # tests/factories.make_user's default
LIVE_MS = 2000  # the promise: a change is on the page within 2 s
FACTS = [
    "Amara explained equivalent fractions to her group using a chocolate bar.",
    "Amara asks for a worked example before trying a new kind of problem.",
    "Amara read two chapters of the class novel over the weekend.",
]


class AsgiServer:
    """uvicorn serving memoryhub.asgi on 127.0.0.1 (one worker), stoppable and restartable on the
    same port, so an open page can lose its server and find it again."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.log_path = log_path
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}"  # the host the kernle CLI sends credentials to

    def start(self) -> None:
        self.process = ManagedProcess(
            name="web",
            argv=[sys.executable, "-m", "uvicorn", "memoryhub.asgi:application", "--host", "127.0.0.1",
                  "--port", str(self.port), "--workers", "1", "--loop", "uvloop", "--http", "httptools",
                  "--no-access-log", "--lifespan", "off"],
            env=dict(os.environ, DATABASE_URL=database_url_for_processes()), cwd=BASE_DIR, log_path=self.log_path,
        )
        self.process.start()
        process = self.process
        wait_for_health(f"http://127.0.0.1:{self.port}", alive=process.running, log=self.log_path, timeout=60)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


@pytest.fixture
def asgi_server(django_db_setup: None, tmp_path: Path) -> Iterator[AsgiServer]:
    server = AsgiServer(tmp_path / "web.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def row_of(page: Page, text: str) -> Any:
    return page.locator("[data-live-list] .memory-row", has_text=text)


def wait_connected(page: Page, timeout_ms: float = 15_000) -> None:
    page.locator('[data-live="stack"][data-live-status="connected"]').wait_for(timeout=timeout_ms)


def tab_count(page: Page, kind: str) -> str:
    return page.locator(f'[data-live-count="{kind}"] .muted').inner_text()


def test_the_page_shows_what_the_cli_writes_live_and_nothing_twice_after_a_reconnect(
        open_page: Callable[[], WatchedPage], asgi_server: AsgiServer, kernle: KernleCLI) -> None:
    org = make_org("Brookside Academy")
    admin = make_user(org, role=Membership.Role.ADMIN, email="head@brookside.example", username="")
    # The server is another process, with the production hashers: not this session's fast MD5.
    hasher = PBKDF2PasswordHasher()
    User.objects.filter(pk=admin.pk).update(password=hasher.encode(PASSWORD, hasher.salt(), iterations=1000))
    stack = make_stack(org, "amara", display_name="Amara Okafor")
    _, secret = make_key(org, stack=stack, user=admin, name="Amara's tutor")
    base = asgi_server.url

    watched = open_page()
    page = watched.page
    sign_in(watched, base, admin.email, PASSWORD)
    watched.goto(f"{base}/dashboard/students/amara/")
    wait_connected(page)
    check_page(watched, "student-live")  # axe with the live indicator, no console error, no CSP refusal
    state = page.locator("[data-live-state]")
    assert state.inner_text() == "Live" and state.get_attribute("role") == "status"

    # The school overview is open in another tab: its row for Amara counts along.
    overview = page.context.new_page()
    overview.goto(f"{base}/dashboard/")
    overview.locator('[data-live="school"][data-live-status="connected"]').wait_for(timeout=15_000)
    amara_count = overview.locator('tr[data-stack="amara"] [data-live-cell="memories"]')
    assert amara_count.inner_text() == "0"

    # 1. The real CLI pushes three notes: each is on the page within 2 s of the push returning.
    agent = agent_signed_in(kernle, secret=secret, backend_url=base, stack="amara",
                            transcript="Tutoring session transcript")
    for fact in FACTS:
        agent.note(fact)
    pushed = agent.run("sync", "push", "--json")
    assert pushed.returncode == 0, cli_output(pushed)
    for fact in FACTS:
        row_of(page, fact).wait_for(timeout=LIVE_MS)
    assert tab_count(page, "note") == "(3)" and tab_count(page, "") == "(3)"
    assert page.locator('[data-live-figure="memories"]').inner_text() == "3"
    # The storage and forgetting cards were drawn when the page loaded: they now say so.
    page.locator("#usage [data-live-stale]").wait_for(state="visible", timeout=LIVE_MS)
    assert page.locator("#candidates [data-live-stale]").is_visible()
    overview.locator('tr[data-stack="amara"] [data-live-cell="memories"]', has_text="3").wait_for(timeout=LIVE_MS)
    assert overview.locator('[data-live-figure="written_today"]').inner_text() == "3"
    overview.close()
    check_page(watched, "student-three-notes")

    # 2. One is forgotten through the native API with the same key: it leaves the list (forgotten
    # memories are hidden by default) within 2 s, and the counts follow.
    forgotten = Memory.objects.get(stack=stack, text=FACTS[1])
    answer = httpx.post(f"{base}/api/v1/stacks/amara/memories/{forgotten.pk}/forget",
                        json={"reason": "shared by mistake"}, headers={"Authorization": f"Bearer {secret}"})
    assert answer.status_code == 200, answer.text
    row_of(page, FACTS[1]).wait_for(state="detached", timeout=LIVE_MS)
    assert tab_count(page, "note") == "(2)" and tab_count(page, "") == "(2)"
    # The header counts what the stack stores, forgotten memories included, and says so.
    stored = page.locator(".student-stats .card", has=page.locator('[data-live-figure="memories"]'))
    assert stored.locator('[data-live-figure="memories"]').inner_text() == "3"
    assert "forgotten ones included" in stored.inner_text()
    assert row_of(page, FACTS[0]).count() == 1 and row_of(page, FACTS[2]).count() == 1
    assert page.url.endswith("/dashboard/students/amara/")  # never reloaded
    check_page(watched, "student-forgotten")

    # 3. The page's socket drops; a memory is written before it reconnects (its first retry waits
    # at least 375 ms): after the reconnect it is there, once.
    page.evaluate("window.MemoryHubLive.drop()")
    dropped_write = "Written while the page's socket was down."
    memory_create(stack=stack, kind="note", payload={"content": dropped_write}, source="api")
    row_of(page, dropped_write).wait_for(timeout=10_000)
    wait_connected(page)
    time.sleep(0.5)  # anything sent twice would have arrived by now
    assert row_of(page, dropped_write).count() == 1

    # 4. The server itself stops; a memory is written meanwhile; the server comes back.
    asgi_server.stop()
    page.locator('[data-live-status="reconnecting"], [data-live-status="offline"]').first.wait_for(timeout=10_000)
    down_write = "Written while the server was down."
    memory_create(stack=Stack.objects.get(pk=stack.pk), kind="note", payload={"content": down_write}, source="api")
    asgi_server.start()
    row_of(page, down_write).wait_for(timeout=40_000)  # the back-off may be several seconds by now
    wait_connected(page)
    time.sleep(0.5)
    assert row_of(page, down_write).count() == 1 and row_of(page, dropped_write).count() == 1
    assert tab_count(page, "note") == "(4)"
    # The failed reconnects while the server was down are the browser's own console errors.
    watched.problems[:] = [p for p in watched.problems if "WebSocket connection to" not in p]
    check_page(watched, "student-after-restart")
