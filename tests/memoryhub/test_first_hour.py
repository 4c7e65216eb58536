"""A newcomer's first hour: `make run`'s printed URLs, static files, offline API docs, and
`manage.py` beside the running service (docs/operations.md §9).

The first test starts the runner exactly as `make run` does (a fresh data dir, free ports, the fast
`hash` embedder) and checks what it prints against the real uvicorn process. The others check the
same pages in-process, where nothing was collected (static files then come from the source
directories through WhiteNoise's finders: tests never depend on a prior collectstatic), and the
one-line failures of `manage.py` without a service.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.test import Client, override_settings

from memoryhub import views
from memoryhub.embedded import free_port
from tests.conftest import run_manage, shared_static_root

pytestmark = pytest.mark.slow  # each test starts manage.py or the runner

BASE_DIR = Path(__file__).resolve().parents[2]
ASSET = re.compile(r'(?:src|href)="([^"]+)"')
ABSOLUTE_URL = re.compile(r"""(?:https?:)?//[\w.-]+""")  # http://x, https://x, protocol-relative //x


def _without_service_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """A second shell: nothing exported but where the data is (and what the test adds)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "MEMORYHUB_PG_PORT", "MEMORYHUB_REDIS_PORT")}
    return {**env, "MEMORYHUB_DATA_DIR": str(data_dir), "MEMORYHUB_STATIC_ROOT": shared_static_root(), **extra}


def _wait_for_line(log_path: Path, process: subprocess.Popen[bytes], needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        if needle in text:
            return text
        if process.poll() is not None:
            raise AssertionError(f"runner exited with {process.returncode} before {needle!r}:\n{text[-4000:]}")
        time.sleep(0.5)
    raise AssertionError(f"no {needle!r} after {timeout:.0f}s:\n{log_path.read_text(errors='replace')[-4000:]}")


def _printed_urls(log: str) -> list[str]:
    """Every URL in the block the runner prints once it is up."""
    block = log[log.index("MemoryHub is up"):]
    block = block[:block.index("Ctrl-C stops everything")]
    return re.findall(r"http://[^\s)]+", block)


def _assets(html: str) -> list[str]:
    return [url for url in ASSET.findall(html) if not url.startswith(("#", "data:"))]


@pytest.mark.long
@pytest.mark.slow
def test_make_run_prints_only_urls_that_work_and_commands_find_the_service(tmp_path: Path) -> None:
    data_dir = tmp_path / "var"
    web_port, pg_port, redis_port = free_port(), free_port(), free_port()
    env = _without_service_env(data_dir, PORT=str(web_port), MEMORYHUB_PG_PORT=str(pg_port),
                               MEMORYHUB_REDIS_PORT=str(redis_port), MEMORYHUB_ANVIL_PORT=str(free_port()),
                               EMBEDDING_PROVIDER="hash",
                               CELERY_CONCURRENCY="1")
    log_path = tmp_path / "runner.log"
    with open(log_path, "ab") as log:
        runner = subprocess.Popen([sys.executable, "-m", "memoryhub.runner"], cwd=BASE_DIR, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{web_port}"
    try:
        log_text = _wait_for_line(log_path, runner, "Ctrl-C stops everything", 300)
        # "up" is said only once /readyz is 200, and the start-up 503s before it are no errors.
        assert httpx.get(f"{base}/readyz", timeout=10).status_code == 200
        assert log_text.index("waiting for") < log_text.index("MemoryHub is up")
        assert "ERROR django.request" not in log_text

        with httpx.Client(base_url=base, timeout=30, follow_redirects=True) as http:
            urls = _printed_urls(log_text)
            assert {f"{base}/", f"{base}/api/docs/", f"{base}/api/schema/", f"{base}/readyz"} <= set(urls)
            for url in urls:
                assert http.get(url).status_code == 200, url

            # "/" is the dashboard, which sends a visitor not signed in to the login page.
            landing = http.get("/")
            assert [r.headers["location"] for r in landing.history] == ["/dashboard/", "/login/?next=/dashboard/"]
            # The page's stylesheet: hashed (cache-busting), cached for good, served compressed.
            [stylesheet] = re.findall(r'<link rel="stylesheet" href="([^"]+)"', landing.text)
            assert re.fullmatch(r"/static/css/dashboard\.[0-9a-f]{12}\.css", stylesheet)
            css = http.get(stylesheet, headers={"Accept-Encoding": "br"})
            assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
            assert css.headers["content-encoding"] == "br" and "immutable" in css.headers["cache-control"]
            for path in ("/static/css/dashboard.css", "/static/admin/css/base.css"):
                response = http.get(path)
                assert response.status_code == 200 and response.headers["content-type"].startswith("text/css"), path

            # The admin's own CSS and JS, as its login page references them.
            admin = http.get("/admin/")
            admin_assets = _assets(admin.text)
            assert any(a.endswith(".css") for a in admin_assets), admin.text
            for asset in admin_assets:
                if asset.startswith("/static/"):
                    assert http.get(asset).status_code == 200, asset

            # API docs: nothing but our own origin, every asset and the schema answer.
            docs = http.get("/api/docs/")
            assert docs.status_code == 200
            assert ABSOLUTE_URL.findall(docs.text) == []
            # Swagger UI's start-up script is a file of its own, "?script=" beside the page (the
            # Content-Security-Policy allows no inline script); it names the schema.
            docs_assets = [a if a.startswith("/") else f"/api/docs/{a}" for a in _assets(docs.text)]
            assert any("swagger-ui-bundle" in a for a in docs_assets), docs.text
            [script] = [a for a in docs_assets if a.endswith("?script=")]
            schema_urls = re.findall(r'url: "([^"]+)"', http.get(script).text)
            assert schema_urls == ["/api/schema/"]
            for asset in docs_assets + schema_urls:
                assert asset.startswith("/"), asset
                assert http.get(asset).status_code == 200, asset

        # A second shell: no variable exported, non-default ports, yet it reaches the service.
        runtime = json.loads((data_dir / "runtime.json").read_text())
        assert runtime["pid"] == runner.pid
        assert runtime["database_url"].endswith(f":{pg_port}/memoryhub")
        shown = run_manage("showmigrations", "accounts", env=_without_service_env(data_dir))
        assert shown.returncode == 0, shown.stderr
        assert "[X] 0001_initial" in shown.stdout
        cached = run_manage("shell", "--verbosity", "0", "-c",
                            "from django.core.cache import cache; cache.set('first-hour', 'ok'); "
                            "print(cache.get('first-hour'))", env=_without_service_env(data_dir))
        assert cached.returncode == 0 and cached.stdout.strip().endswith("ok"), cached.stderr

        # A second `make run` on the same data says so instead of fighting over the servers.
        second = subprocess.run([sys.executable, "-m", "memoryhub.runner"], cwd=BASE_DIR, env=env,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 1
        assert f"already running from {data_dir}" in second.stdout
    finally:
        os.killpg(runner.pid, signal.SIGINT)
        runner.wait(90)
    assert runner.returncode == 0, log_path.read_text()[-3000:]
    assert not (data_dir / "runtime.json").exists()

    # The service is gone: one line saying what was tried and what to do, exit 1, no traceback.
    gone = run_manage("showmigrations", env=_without_service_env(data_dir, MEMORYHUB_PG_PORT=str(pg_port)))
    assert gone.returncode == 1
    assert "Traceback" not in gone.stderr + gone.stdout
    [line] = gone.stderr.strip().splitlines()
    assert f"cannot reach PostgreSQL at 127.0.0.1:{pg_port}" in line
    assert "start the service with `make run` or set DATABASE_URL" in line


def test_a_command_without_a_service_fails_in_one_line(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    result = run_manage("showmigrations", env=_without_service_env(tmp_path, MEMORYHUB_PG_PORT=str(port)))
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.strip() == (
        f"manage.py showmigrations: cannot reach PostgreSQL at 127.0.0.1:{port} (the embedded server at "
        f"MEMORYHUB_PG_PORT={port}; no `make run` is running with data in {tmp_path}): start the service with "
        "`make run` or set DATABASE_URL")


def test_a_stale_runtime_file_is_ignored(tmp_path: Path) -> None:
    """A runner killed with SIGKILL leaves its file behind; its pid is dead, so it means nothing."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    recorded_port, default_port = free_port(), free_port()
    (tmp_path / "runtime.json").write_text(json.dumps({
        "pid": dead.pid, "database_url": f"postgresql://postgres@127.0.0.1:{recorded_port}/memoryhub"}))
    result = run_manage("showmigrations", env=_without_service_env(tmp_path, MEMORYHUB_PG_PORT=str(default_port)))
    assert result.returncode == 1
    assert f"127.0.0.1:{default_port}" in result.stderr and str(recorded_port) not in result.stderr


def test_unreachable_redis_is_one_line_too() -> None:
    port = free_port()
    env = dict(os.environ, REDIS_URL=f"redis://:hunter2-password@127.0.0.1:{port}/0")
    result = run_manage("shell", "-c", "from django.core.cache import cache; cache.get('x')", env=env)
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line == (f"manage.py shell: cannot reach Redis at 127.0.0.1:{port} (from REDIS_URL): "
                    "start the service with `make run` or set REDIS_URL")
    assert "hunter2" not in result.stderr  # a password in the URL stays out of the message


def test_traceback_flag_still_shows_the_traceback(tmp_path: Path) -> None:
    env = _without_service_env(tmp_path, MEMORYHUB_PG_PORT=str(free_port()))
    result = run_manage("showmigrations", "--traceback", env=env)
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "OperationalError" in result.stderr


# In-process: nothing collected in the test session, so the finders serve the source files.

def _body(response: object) -> bytes:
    streaming = getattr(response, "streaming_content", None)
    return b"".join(streaming) if streaming is not None else bytes(response.content)  # type: ignore[attr-defined]


@pytest.mark.django_db
def test_root_leads_to_the_dashboard_and_then_the_login_page(client: Client) -> None:
    response = client.get("/", follow=True)
    assert response.status_code == 200
    assert response.redirect_chain == [("/dashboard/", 302), ("/login/?next=/dashboard/", 302)]
    assert b'href="/static/css/dashboard.css"' in response.content  # not collected: the plain name


@pytest.mark.parametrize("path", ["/static/css/dashboard.css", "/static/admin/css/base.css",
                                  "/static/admin/js/core.js",
                                  "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js"])
def test_static_files_are_served_without_collectstatic(client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert len(_body(response)) > 100


def test_api_docs_reference_only_our_own_files(client: Client) -> None:
    docs = client.get("/api/docs/")
    html = docs.content.decode()
    assert docs.status_code == 200
    assert ABSOLUTE_URL.findall(html) == []
    assets = _assets(html)
    # "?script=" is Swagger UI's start-up script, served as a file for the Content-Security-Policy.
    assert {a.rsplit("/", 1)[-1] for a in assets} == {
        "favicon-32x32.png", "swagger-ui.css", "swagger-ui-bundle.js", "swagger-ui-standalone-preset.js", "?script="}
    for asset in assets:
        assert client.get(asset if asset.startswith("/") else f"/api/docs/{asset}").status_code == 200, asset
    assert "script-src 'self'" in docs["Content-Security-Policy"]
    assert "<script>" not in html  # nothing inline for the policy to block


@pytest.mark.django_db(transaction=True)
def test_readyz_503_is_not_an_error_at_start_up_and_a_warning_in_an_outage(
    client: Client, celery_worker: object, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setattr(views, "_was_ready", False)  # a process that has not been ready yet
    caplog.set_level(logging.DEBUG)
    with override_settings(REDIS_URL=dead_redis):
        assert client.get("/readyz").status_code == 503
    start_up = [r for r in caplog.records if r.name in ("django.request", "memoryhub.views")]
    assert [(r.name, r.levelno) for r in start_up] == [("memoryhub.views", logging.DEBUG)]

    caplog.clear()
    assert client.get("/readyz").status_code == 200  # ready: from now on a 503 is an outage
    with override_settings(REDIS_URL=dead_redis):
        assert client.get("/readyz").status_code == 503
    outage = [r for r in caplog.records if r.name in ("django.request", "memoryhub.views")]
    assert [(r.name, r.levelno) for r in outage] == [("memoryhub.views", logging.WARNING)]
    assert outage[0].getMessage().startswith("not ready: redis: unreachable")
