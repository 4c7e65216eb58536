"""Limits at the edge (memoryhub/limits.py; docs/operations.md §6), and a websocket to an unknown path.

The body limit is an ASGI concern, so it is tested against the real app under a real uvicorn
process, measuring that process's memory: a 20 MB body — declared with Content-Length or streamed
chunked — gets a 413 and leaves the server's RSS where it was. The JSON bounds live in the parser
every DRF view shares and are tested through the ordinary test client.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from secrets import token_hex
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.views import APIView
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as websocket_connect
from websockets.typing import Origin

from accounts.authentication import request_credential_verifies
from memories.models import Memory
from memoryhub.embedded import ManagedProcess, free_port
from memoryhub.limits import (
    JSON_MAX_DEPTH,
    JSON_MAX_STRING_CHARS,
    BoundedBodyParser,
    BoundedJSONParser,
    RequestBodyLimit,
)
from stacks.services import personal_account_register
from tests.factories import (
    bearer_client,
    database_url_for_processes,
    make_key,
    make_org,
    make_stack,
    make_user,
    wait_for_health,
)

pytestmark = pytest.mark.slow  # a real uvicorn process

BASE_DIR = Path(__file__).resolve().parents[2]
MB = 1024 * 1024
BIG = 20 * MB
LOCAL_ORIGIN = Origin("http://localhost")


@pytest.fixture(scope="module")
def web(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The real ASGI app under uvicorn, as `make run` starts it (uvloop, httptools), on the test
    database and Redis. Yields its base URL, pid and log file."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("web") / "web.log"
    server = ManagedProcess(
        name="web",
        argv=[sys.executable, "-m", "uvicorn", "memoryhub.asgi:application", "--host", "127.0.0.1",
              "--port", str(port), "--workers", "1", "--loop", "uvloop", "--http", "httptools",
              "--no-access-log", "--lifespan", "off"],
        env=dict(os.environ, DATABASE_URL=database_url_for_processes()), cwd=BASE_DIR, log_path=log_path,
    )
    server.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(base_url, alive=server.running, log=log_path, timeout=60)
        yield {"url": base_url, "port": port, "pid": server.pid, "log": log_path}
    finally:
        server.stop()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _chunks(size: int, chunk: int = 64 * 1024) -> Iterator[bytes]:
    """A body of unknown length: httpx sends a generator with Transfer-Encoding: chunked."""
    block = b"x" * chunk
    sent = 0
    while sent < size:
        yield block
        sent += chunk


def _big_posts(url: str) -> list[tuple[str, httpx.Response]]:
    """20 MB, declared and chunked, to an authenticated route and to an unauthenticated one."""
    answers = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for path, headers in (("/sync/push", {"authorization": "Bearer knl_sk_" + "0" * 40}),
                              ("/auth/register", {})):
            headers = {**headers, "content-type": "application/json"}
            declared = client.post(path, content=b"x" * BIG, headers=headers)
            answers.append((f"{path} with Content-Length", declared))
            streamed = client.post(path, content=_chunks(BIG), headers=headers)
            answers.append((f"{path} chunked", streamed))
    return answers


@pytest.mark.django_db(transaction=True)
def test_20_mb_bodies_get_413_and_leave_the_web_process_rss_unchanged(web: dict[str, Any]) -> None:
    _big_posts(web["url"])  # warm-up: first-use imports and buffers are not what is measured
    before = _rss_kib(web["pid"])
    for _ in range(3):
        answers = _big_posts(web["url"])
        for what, response in answers:
            assert response.status_code == 413, (what, response.status_code, response.text[:200])
            error = response.json()["error"]
            assert error["code"] == "payload_too_large", what
            assert response.headers["content-type"] == "application/json"
    growth_mib = (_rss_kib(web["pid"]) - before) / 1024
    print(f"\nweb RSS {before / 1024:.1f} MiB before 12 x 20 MB bodies, growth {growth_mib:+.1f} MiB")
    # Read and parsed, twelve 20 MB bodies would add hundreds of MB; refused, nothing of them stays.
    assert growth_mib < 4, f"the web process grew by {growth_mib:.1f} MiB"
    assert httpx.get(f"{web['url']}/health").status_code == 200  # the server is fine afterwards


@pytest.mark.django_db(transaction=True)
def test_unauthenticated_routes_have_the_smaller_limit_and_the_rest_still_work(web: dict[str, Any]) -> None:
    from django.conf import settings

    small = settings.MAX_UNAUTHENTICATED_REQUEST_BYTES
    org = make_org()
    stack = make_stack(org, "ada")
    _, secret = make_key(org, stack=stack)
    # Eight long notes: more than the small limit, far less than MAX_REQUEST_BYTES.
    notes = [{"operation": "update", "table": "notes", "record_id": f"n{i}", "local_updated_at": None,
              "data": {"content": "Fractions " + "y" * (small // 4)}} for i in range(8)]
    with httpx.Client(base_url=web["url"], timeout=30) as client:
        register = client.post("/auth/register", content=b"{" + b" " * small + b"}",
                               headers={"content-type": "application/json"})
        anonymous = client.post("/sync/push", json={"stack_id": "ada", "operations": notes})
        pushed = client.post("/sync/push", json={"stack_id": "ada", "operations": notes},
                             headers={"authorization": f"Bearer {secret}"})
        small_register = client.post("/auth/register", json={"email": "not-an-email"})
    assert register.status_code == 413 and str(small) in register.json()["error"]["message"].replace(",", "")
    assert anonymous.status_code == 413  # no credential at all: the small limit too
    assert pushed.status_code == 200, pushed.text
    assert pushed.json()["synced"] == 8
    assert Memory.objects.filter(stack=stack).count() == 8
    assert small_register.status_code == 400  # under the limit: the view's own validation answers


def _key_and_session() -> tuple[str, str]:
    """The secret of an agent key of stack "ada" and the session key of its school's admin, signed in."""
    org = make_org()
    _, secret = make_key(org, stack=make_stack(org, "ada"))
    browser = Client()
    browser.force_login(make_user(org))
    return secret, browser.cookies[settings.SESSION_COOKIE_NAME].value


@pytest.mark.django_db(transaction=True)
def test_a_bogus_credential_gets_the_strangers_limit_over_http(web: dict[str, Any]) -> None:
    """A credential merely present raised a stranger's 64 KiB to 16 MiB, read in full before the
    401. Now a 1 MiB body with a bogus Bearer header or session cookie is a 413 at the stranger's
    limit; with a valid key or session it passes the edge and reaches the view."""
    small = settings.MAX_UNAUTHENTICATED_REQUEST_BYTES
    secret, session = _key_and_session()
    json_type = {"content-type": "application/json"}
    bogus = [{"authorization": "Bearer x"}, {"authorization": "Bearer knl_sk_" + "0" * 40},
             {"cookie": f"{settings.SESSION_COOKIE_NAME}=x"}]
    with httpx.Client(base_url=web["url"], timeout=30) as client:
        for headers in bogus:
            for how, content in (("declared", b"x" * MB), ("chunked", _chunks(MB))):
                response = client.post("/sync/push", content=content, headers={**headers, **json_type})
                assert response.status_code == 413, (headers, how, response.status_code)
                assert response.json()["error"]["code"] == "payload_too_large"
                assert f"{small:,}" in response.json()["error"]["message"], (headers, how)
        # Past the edge, the view answers: not JSON (400) for the key, no CSRF token (403) for the session.
        keyed = client.post("/sync/push", content=b"x" * MB, headers={"authorization": f"Bearer {secret}", **json_type})
        assert keyed.status_code == 400 and keyed.json()["error"]["code"] != "payload_too_large"
        signed_in = client.post("/api/v1/stacks/", content=_chunks(MB),
                                headers={"cookie": f"{settings.SESSION_COOKIE_NAME}={session}", **json_type})
        assert signed_in.status_code == 403, signed_in.text


class _Edge:
    """RequestBodyLimit in front of an app that reads the whole body, driven as the server drives
    it, with the real credential check (database and Redis): how much of the body was taken."""

    CHUNK = 64 * 1024

    def __init__(self) -> None:
        self.app_called = False

    async def _app(self, scope: Any, receive: Any, send: Any) -> None:
        self.app_called = True
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    def post(self, headers: dict[str, str], size: int, *, declared: bool) -> tuple[int, dict[str, Any], int]:
        """(status, body, bytes the server handed over) for a POST /sync/push of `size` bytes."""
        chunks = [b"x" * self.CHUNK] * (size // self.CHUNK)
        pulled = 0
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            nonlocal pulled
            if not chunks:
                return {"type": "http.disconnect"}
            chunk = chunks.pop()
            pulled += len(chunk)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(dict(message))

        framing = [(b"content-length", str(size).encode())] if declared else [(b"transfer-encoding", b"chunked")]
        scope = {"type": "http", "method": "POST", "path": "/sync/push", "client": ("127.0.0.1", 50123),
                 "headers": [*framing, *((k.encode(), v.encode()) for k, v in headers.items())]}
        asyncio.run(RequestBodyLimit(self._app, credential_verifies=request_credential_verifies)(scope, receive, send))
        body = json.loads(sent[1]["body"]) if sent[1]["body"] else {}
        return sent[0]["status"], body, pulled


@pytest.mark.django_db(transaction=True)
def test_a_bogus_credential_is_refused_before_the_body_is_read_past_the_strangers_limit() -> None:
    small = settings.MAX_UNAUTHENTICATED_REQUEST_BYTES
    secret, session = _key_and_session()
    cookie = settings.SESSION_COOKIE_NAME
    for headers in ({"authorization": "Bearer x"}, {"authorization": f"Bearer knl_sk_{'0' * 40}"},
                    {"cookie": f"{cookie}=x"}, {"cookie": f"{cookie}={session[:-1]}"}):
        edge = _Edge()
        status, body, pulled = edge.post(headers, MB, declared=True)
        assert (status, body["error"]["code"], pulled, edge.app_called) == (413, "payload_too_large", 0, False)
        assert f"{small:,}" in body["error"]["message"]
        status, _, pulled = edge.post(headers, MB, declared=False)
        assert status == 413 and pulled <= small + _Edge.CHUNK, (headers, pulled)  # not the whole MiB
    for headers in ({"authorization": f"Bearer {secret}"}, {"cookie": f"{cookie}={session}"}):
        for declared in (True, False):
            status, _, pulled = _Edge().post(headers, MB, declared=declared)
            assert (status, pulled) == (200, MB), (headers, declared)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("throttle_clock")
def test_bogus_credentials_with_big_bodies_count_as_failed_authentications() -> None:
    """Else a big body would be a free oracle: 413 for a wrong key, let through for a right one."""
    for _ in range(settings.AUTH_FAILURE_LIMITS["bearer_ip"][0]):
        assert _Edge().post({"authorization": f"Bearer knl_sk_{token_hex(16)}"}, MB, declared=True)[0] == 413
    refused = bearer_client(f"knl_sk_{token_hex(16)}").get("/api/v1/stacks/")  # from 127.0.0.1 too
    assert refused.status_code == 429 and refused["Retry-After"]


@pytest.mark.django_db(transaction=True)
def test_a_websocket_to_an_unknown_path_is_refused_cleanly(web: dict[str, Any]) -> None:
    """A websocket to a path no route serves is refused, not an HTTP 500 with a traceback in the log."""
    log_before = web["log"].read_text()
    for path in ("/ws/nope/", "/", "/ws/probe/extra"):
        with pytest.raises(InvalidStatus) as refused:
            websocket_connect(f"ws://127.0.0.1:{web['port']}{path}", origin=LOCAL_ORIGIN,
                              open_timeout=10)
        assert refused.value.response.status_code == 403, path
    # The probe without a signed-in session is refused the same way.
    with pytest.raises(InvalidStatus) as anonymous:
        websocket_connect(f"ws://127.0.0.1:{web['port']}/ws/probe/", origin=LOCAL_ORIGIN,
                          open_timeout=10)
    assert anonymous.value.response.status_code == 403
    time.sleep(0.5)  # let the server flush its log
    new_log = web["log"].read_text()[len(log_before):]
    # The status follows the quoted request line ('"WebSocket /ws/nope/" 403'); a bare "500" could be
    # part of a client's port number.
    assert "Traceback" not in new_log and "Exception" not in new_log and '" 500' not in new_log, new_log


# --- the JSON bounds (the shared DRF parser; any server) -------------------------------------------------

def _nested(depth: int) -> bytes:
    """A body `depth` levels deep: {"content": "x", "n": [[...]]}."""
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    return f'{{"kind": "note", "content": "x", "n": {inner}}}'.encode()


@pytest.mark.django_db
def test_json_deeper_than_the_limit_or_with_a_huge_string_is_400_and_stores_nothing() -> None:
    org = make_org()
    stack = make_stack(org, "ada")
    _, secret = make_key(org, stack=stack)
    client = bearer_client(secret)
    url = "/api/v1/stacks/ada/memories"
    too_deep = client.post(url, data=_nested(JSON_MAX_DEPTH + 1), content_type="application/json")
    very_deep = client.post(url, data=_nested(5000), content_type="application/json")
    long_string = json.dumps({"kind": "note", "content": "x", "n": "y" * (JSON_MAX_STRING_CHARS + 1)})
    too_long = client.post(url, data=long_string, content_type="application/json")
    long_key = client.post(url, data=json.dumps({"k" * (JSON_MAX_STRING_CHARS + 1): 1}),
                           content_type="application/json")
    codes = [(r.status_code, r.json()["error"]["code"]) for r in (too_deep, very_deep, too_long, long_key)]
    assert codes == [(400, "json_too_deep")] * 2 + [(400, "json_string_too_long")] * 2
    assert too_deep.json()["error"]["message"] == "The JSON body is nested too deeply."
    assert Memory.objects.count() == 0
    # At the limit the parser lets it through and the view decides (here it refuses the record's
    # odd field `n` itself, as the record's own fault).
    at_limit = client.post(url, data=_nested(JSON_MAX_DEPTH), content_type="application/json")
    assert at_limit.status_code == 400
    assert at_limit.json()["error"]["code"] not in ("json_too_deep", "json_string_too_long")


@pytest.mark.django_db
def test_the_parser_caps_the_body_under_any_server(settings: Any) -> None:
    """Behind the ASGI limit the parser reads at most MAX_REQUEST_BYTES itself: the WSGI test
    client below has no ASGI layer in front of it."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1 * MB
    reg = personal_account_register(stack_id="acceptance", email="cap@example.test")
    body = json.dumps({"stack_id": "acceptance", "operations": [{"pad": "z" * (1 * MB)}]})
    response = Client().post("/sync/push", data=body, content_type="application/json",
                             headers={"authorization": f"Bearer {reg.secret}"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert Memory.objects.count() == 0



def test_every_api_view_parses_bodies_with_the_bounded_parser() -> None:
    """The bounds hold only if no view brings an unbounded parser of its own: walk the live URLconf."""
    views: list[type[APIView]] = []

    def walk(patterns: list[URLPattern | URLResolver]) -> None:
        for entry in patterns:
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns)
                continue
            view = getattr(entry.callback, "cls", None)
            if isinstance(view, type) and issubclass(view, APIView):
                views.append(view)

    walk(get_resolver().url_patterns)
    assert len(views) > 20
    unbounded = sorted({f"{v.__module__}.{v.__name__}" for v in views
                        if not all(issubclass(p, BoundedJSONParser | BoundedBodyParser) for p in v.parser_classes)})
    assert unbounded == []
