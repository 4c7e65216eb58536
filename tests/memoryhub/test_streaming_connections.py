"""Streamed downloads give their database connection back (memoryhub/streaming.py, memoryhub/asgi.py).

The real ASGI application is driven in-process (httpx's ASGI transport, or raw ASGI messages), so
the handler's own threads and the process's real connection pool are used, as behind uvicorn. A
download whose connection stayed checked out showed as the pool running dry after its size of
downloads: every later request waited the pool's 5 s and answered 503.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import string
import time
import zipfile
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import connection, connections
from django.test import Client

import memories.governance.archive
from memoryhub.asgi import application
from tests.actors import School

# The handler's threads use their own connections; slow: dozens of whole downloads.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NORMAL_SECONDS = 2.0  # a plain GET answers well within this; a request waiting for the pool takes 5 s


@pytest.fixture
def stack_with_memories(school: School, monkeypatch: pytest.MonkeyPatch) -> School:
    """`school`'s stack with 120 memories, and archive chunks as small as the compressor gives them:
    every export is several chunks, each read from the database when the client takes it."""
    rng = random.Random(7)  # made-up words: text that deflate cannot shrink to nothing
    operations = [{"op": "upsert", "kind": "note", "record_id": f"note-{n}",
                   "data": {"content": " ".join("".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(80))}}
                  for n in range(120)]
    response = school.agent.post(school.stack_url("sync/push"), {"operations": operations}, format="json")
    assert response.status_code == 200 and response.json()["rejected"] == 0
    monkeypatch.setattr(memories.governance.archive, "FLUSH_BYTES", 1)
    return school


def _checked_out() -> int:
    """Connections of this process's pool in use right now (the test's own included)."""
    stats = connection.pool.get_stats()  # type: ignore[attr-defined]  # the postgresql backend's pool
    return int(stats["pool_size"] - stats["pool_available"])


def _complete(path: str, body: bytes) -> None:
    if path.endswith(("/export/archive", "/archive.zip")):
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            assert archive.testzip() is None
            assert json.loads(archive.read("manifest.json"))["counts"]["memories/note.jsonl"] == 120
    elif path.endswith("/export.json"):
        assert len(json.loads(body)["memories"]) == 120
    else:
        assert body.startswith(b"when (UTC),") and body.endswith(b"\r\n")


def _downloads_in_a_row(downloads: list[tuple[str, dict[str, str]]], plain: tuple[str, dict[str, str]],
                        rounds: int) -> None:
    """On ONE client connection, `rounds` times: each download (200, read to its end, complete),
    then the plain GET (200 within the normal time). Fails at the first download or GET that
    does not, rather than after all of them."""
    async def run() -> None:
        transport = httpx.ASGITransport(app=application)  # type: ignore[arg-type]  # ASGI types spelled loosely
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=30) as client:
            for n in range(rounds):
                for path, headers in downloads:
                    response = await client.get(path, headers=headers)
                    assert response.status_code == 200, (n, path, response.status_code, response.text[:200])
                    _complete(path, response.content)
                    started = time.monotonic()
                    answer = await client.get(plain[0], headers=plain[1])
                    took = time.monotonic() - started
                    assert answer.status_code == 200 and took < NORMAL_SECONDS, (n, path, answer.status_code, took)

    asyncio.run(run())


def test_fifty_archive_exports_on_one_connection_leave_the_pool_as_they_found_it(stack_with_memories: School) -> None:
    """A stack's own agent key exporting its archive 50 times in a row: each export is whole, the
    request after it is served at once, and no connection is left checked out."""
    school = stack_with_memories
    key = {"Authorization": f"Bearer {school.agent_secret}", "Accept-Encoding": "identity"}
    before = _checked_out()
    _downloads_in_a_row([(school.stack_url("export/archive"), key)], (school.stack_url(), key), rounds=50)
    assert _checked_out() <= before
    connections.close_all()


def test_dashboard_downloads_in_a_row_leave_the_pool_as_they_found_it(stack_with_memories: School) -> None:
    """The dashboard's export.json, archive.zip and audit CSV, one after another on one connection
    with an admin's session, more times than the pool has connections."""
    school = stack_with_memories
    browser = Client()
    browser.force_login(school.admin)
    session = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}",
               "Accept-Encoding": "identity"}
    base = f"/dashboard/students/{school.stack.slug}"
    downloads = [(f"{base}/export.json", session), (f"{base}/archive.zip", session),
                 ("/dashboard/audit/?format=csv", session)]
    key = {"Authorization": f"Bearer {school.agent_secret}"}
    before = _checked_out()
    rounds = int(getattr(settings, "DB_POOL_MAX_SIZE", 0) or 10) // 2 + 2
    _downloads_in_a_row(downloads, (school.stack_url(), key), rounds=rounds)
    assert _checked_out() <= before
    connections.close_all()


def test_gzipped_archive_is_one_whole_gzip_stream(stack_with_memories: School) -> None:
    """A client that accepts gzip (httpx, curl --compressed, browsers) gets the whole archive: the
    body is compressed as one stream, not as one gzip member per chunk, which such clients stop
    reading after the first."""
    school = stack_with_memories
    key = {"Authorization": f"Bearer {school.agent_secret}", "Accept-Encoding": "gzip"}
    _downloads_in_a_row([(school.stack_url("export/archive"), key)], (school.stack_url(), key), rounds=1)
    connections.close_all()


def test_a_client_leaving_mid_download_stops_the_reading_and_gives_the_connection_back(
        stack_with_memories: School) -> None:
    """The client goes away after the first body chunk: the handler returns promptly, reads no
    more of the archive, and the connection the body read with is back in the pool."""
    school = stack_with_memories
    assert len(list(memories.governance.archive.archive_chunks(stack=school.stack))) >= 4
    connections.close_all()
    before = _checked_out()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": school.stack_url("export/archive"), "raw_path": school.stack_url("export/archive").encode(),
             "query_string": b"", "root_path": "", "server": ("testserver", 80), "client": ("127.0.0.1", 5000),
             "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {school.agent_secret}".encode())]}
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()

    async def run() -> None:
        requested = False

        async def receive() -> dict[str, Any]:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and message.get("body"):
                gone.set()  # the client leaves once it has the first chunk
                await asyncio.sleep(0.05)

        await asyncio.wait_for(application(scope, receive, send), timeout=20)

    asyncio.run(run())
    assert sent[0]["status"] == 200
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert len(bodies) <= 2 and not any(m.get("more_body") is False and m.get("body") for m in bodies)
    assert _checked_out() <= before
    connections.close_all()
