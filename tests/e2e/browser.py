"""Browser fixtures and helpers: the dashboard in real Chromium, driven by Playwright.

Debian's `chromium` (/usr/bin/chromium, installed by `make test` when missing) is launched once per
module; each test gets fresh browser contexts (cookies, storage) from it, so roles never share a
session. The server is pytest-django's `live_server` (a thread of this process, on the test
database): tests need ``@pytest.mark.django_db(transaction=True)`` so it sees what they write.

* ``browser`` (module): the launched Chromium (why not session-scoped: see the fixture).
* ``dashboard_url`` (function): the live server's base URL, ``http://localhost:PORT``.
* ``open_page`` (function): ``open_page()`` returns a :class:`WatchedPage` in a new context —
  one per person signed in during a test. Every request to another host than 127.0.0.1/localhost
  is aborted and reported: the dashboard must work offline (no CDN).
  Confirmation dialogs (``data-confirm``) are accepted and their questions kept in ``.dialogs``.
* ``sign_in(page, email, password)``: through the real sign-in form.
* ``check_page(page, name, status=200)``: the checks every visited page gets — the document's HTTP
  status, a full-page screenshot at ``<artifacts>/screenshots/<test>/<NN>-<name>.png``, axe-core
  with 0 serious or critical violations, and no console error, page error, Content-Security-Policy
  refusal, off-host request, failed request or resource answered with a status of 400 or more
  (the page's own document aside: its status is the one checked) since the previous check.

Artifacts go to ``$MEMORYHUB_TEST_ARTIFACTS`` (default ``var/test-artifacts``); the screenshot
folder is printed once in the terminal summary (``pytest_terminal_summary``, collected through
tests/e2e/conftest.py).

axe-core (node_modules/axe-core, installed by `make install` from package.json) is evaluated through
the DevTools protocol (``page.evaluate``), which is not page script: the page's
Content-Security-Policy stays exactly as served — inline <script> would be refused, and a context
with ``bypass_csp`` would stop the tests from noticing a page that needs inline script.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Dialog,
    Page,
    Playwright,
    Request,
    Response,
    Route,
    ViewportSize,
    sync_playwright,
)

BASE_DIR = Path(__file__).resolve().parent.parent.parent
CHROMIUM = "/usr/bin/chromium"
# No sandbox (containers have no user namespaces), no GPU, and none of Chromium's own traffic
# (component updates, sync, safe-browsing lists): the only host the browser talks to is ours.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})
AXE_SOURCE = BASE_DIR / "node_modules" / "axe-core" / "axe.min.js"
BLOCKING_IMPACTS = ("serious", "critical")
VIEWPORT: ViewportSize = {"width": 1280, "height": 900}
TIMEOUT_MS = 15_000


def artifacts_dir() -> Path:
    return Path(os.environ.get("MEMORYHUB_TEST_ARTIFACTS") or BASE_DIR / "var" / "test-artifacts")


def screenshots_dir() -> Path:
    return artifacts_dir() / "screenshots"


_screenshots_taken: list[Path] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say once, at the end of the run, where this run's screenshots are."""
    if _screenshots_taken:
        terminalreporter.write_sep("-", "browser screenshots")
        terminalreporter.write_line(f"{len(_screenshots_taken)} screenshots under {screenshots_dir()}")


@dataclass
class Screenshots:
    """One test's screenshot folder; steps are numbered across all its pages, in the order taken."""

    folder: Path
    taken: int = 0

    def next_path(self, name: str) -> Path:
        self.taken += 1
        path = self.folder / f"{self.taken:02d}-{name}.png"
        _screenshots_taken.append(path)
        return path


@dataclass
class WatchedPage:
    """A Playwright page plus what it reported since the last `check_page`."""

    page: Page
    shots: Screenshots
    problems: list[str] = field(default_factory=list)
    document_status: int | None = None
    dialogs: list[str] = field(default_factory=list)  # confirm() questions asked (and accepted)

    def _on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            where = message.location.get("url", "") if message.location else ""
            self.problems.append(f"console error: {message.text} ({where})")

    def _on_response(self, response: Response) -> None:
        if response.request.is_navigation_request() and response.frame == self.page.main_frame:
            self.document_status = response.status  # the page itself: `check_page` compares it
        elif response.status >= 400:
            # A stylesheet, script, icon or fetch the page asked for and did not get (the icon
            # browsers ask for on their own included): the page is broken even if nothing is logged.
            self.problems.append(f"{response.request.resource_type} answered {response.status}: {response.url}")

    def _on_request_failed(self, request: Request) -> None:
        failure = request.failure or ""
        # ERR_ABORTED: the browser dropped the request itself (the page navigated on, or a download
        # was refused: contexts accept none); blockedbyclient: `_off_host` has reported it.
        if "ERR_ABORTED" not in failure and "ERR_BLOCKED_BY_CLIENT" not in failure:
            self.problems.append(f"{request.resource_type} failed ({failure}): {request.url}")

    def _on_dialog(self, dialog: Dialog) -> None:
        # `<form data-confirm="…">` asks before a destructive POST; a person clicks OK.
        self.dialogs.append(dialog.message)
        dialog.accept()

    def _off_host(self, route: Route, request: Request) -> None:
        host = urlsplit(request.url).hostname or ""
        if request.url.startswith(("data:", "blob:")) or host in LOCAL_HOSTS:
            route.continue_()
        else:
            self.problems.append(f"request to another host blocked: {request.url}")
            route.abort("blockedbyclient")

    def goto(self, url: str) -> int:
        """Navigate to `url`; the HTTP status of the document."""
        response = self.page.goto(url, wait_until="load")
        assert response is not None, url
        return response.status


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Chromium, for one test module.

    Module-scoped, not session-scoped: while Playwright's sync API runs, its asyncio loop counts as
    running on this thread, so Django refuses ORM calls (SynchronousOnlyOperation) and
    `asyncio.run` fails. The test's own ORM calls here are plain sync code and the server is
    another thread, so Django's check is switched off for exactly as long as the browser lives —
    never for the modules that run after this one."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (never `playwright install`)")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        playwright: Playwright = sync_playwright().start()
        try:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield launched
            launched.close()
        finally:
            playwright.stop()


@pytest.fixture
def dashboard_url(live_server: Any) -> str:
    """The live server as http://localhost:PORT (the host the kernle CLI sends credentials to)."""
    return str(live_server.url).replace("://127.0.0.1:", "://localhost:").rstrip("/")


def _test_dir(request: pytest.FixtureRequest) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name).strip("-")
    folder = screenshots_dir() / name
    shutil.rmtree(folder, ignore_errors=True)  # a re-run's screenshots replace, never mix with, the last
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def open_page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Callable[[], WatchedPage]]:
    """`open_page()`: a watched page in a new browser context (one per person in the test)."""
    contexts = []
    shots = Screenshots(_test_dir(request))

    def new() -> WatchedPage:
        context = browser.new_context(viewport=VIEWPORT, locale="en-GB", timezone_id="Europe/London",
                                      accept_downloads=False, service_workers="block")
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        page = context.new_page()
        watched = WatchedPage(page=page, shots=shots)
        context.route("**/*", watched._off_host)
        page.on("console", watched._on_console)
        page.on("pageerror", lambda error: watched.problems.append(f"page error: {error}"))
        page.on("response", watched._on_response)
        page.on("requestfailed", watched._on_request_failed)
        page.on("dialog", watched._on_dialog)
        return watched

    yield new
    for context in contexts:
        context.close()


def sign_in(watched: WatchedPage, base_url: str, email: str, password: str, *,
            expect_path: str = "/dashboard/") -> None:
    """Sign in through the real form (checked like every page), landing on `expect_path`."""
    page = watched.page
    watched.goto(f"{base_url}/login/")
    check_page(watched, "sign-in")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state("load")
    assert urlsplit(page.url).path == expect_path, f"after signing in as {email}: {page.url}"


def _axe_violations(page: Page) -> list[dict[str, Any]]:
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(_axe_source())
    result: dict[str, Any] = page.evaluate(
        "async () => { const r = await axe.run(document, {resultTypes: ['violations']});"
        " return {violations: r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " targets: v.nodes.map(n => n.target.join(' ')).slice(0, 5)}))}; }")
    return [v for v in result["violations"] if v["impact"] in BLOCKING_IMPACTS]


@cache
def _axe_source() -> str:
    if not AXE_SOURCE.is_file():
        pytest.fail(f"{AXE_SOURCE} is missing: run `make install` (axe-core comes from package.json)")
    return AXE_SOURCE.read_text()


def check_page(watched: WatchedPage, name: str, *, status: int = 200) -> Path:
    """Screenshot the page as it is now and check it: status, accessibility, console, CSP, hosts.

    An error page (`status` >= 400) may log the browser's own "Failed to load resource" for its
    document; nothing else may be logged. Returns the screenshot's path."""
    page = watched.page
    page.wait_for_load_state("load")
    shot = watched.shots.next_path(name)
    page.screenshot(path=str(shot), full_page=True)
    assert watched.document_status == status, (
        f"{name}: {page.url} answered {watched.document_status}, expected {status} (screenshot {shot})")
    problems = [p for p in watched.problems
                if not (status >= 400 and p.startswith("console error: Failed to load resource")
                        and f"status of {status}" in p)]
    watched.problems.clear()
    violations = _axe_violations(page)
    report = [f"{v['impact']} {v['id']}: {v['help']} at {', '.join(v['targets'])}" for v in violations]
    assert not problems and not report, (
        f"{name} ({page.url}, screenshot {shot}):\n" + "\n".join(problems + report))
    return shot
