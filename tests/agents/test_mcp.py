"""MCP over streamable HTTP at /mcp (docs/architecture.md §12): the official `mcp` client against the real server.

The server is the real ASGI app under uvicorn with lifespan events on (as `make run` starts it), on
the test database and Redis; the client is `mcp.client.streamable_http.streamable_http_client` +
`ClientSession`, authenticated with the same Bearer API keys as the REST API.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from memories.models import Memory
from memoryhub.embedded import ManagedProcess, free_port
from tests.factories import bearer_client, database_url_for_processes, make_key, make_org, make_stack, wait_for_health

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BASE_DIR = Path(__file__).resolve().parents[2]
ALL_TOOLS = {"memory_search", "memory_load", "memory_remember", "memory_get", "memory_forget", "memory_recover",
             "checkpoint_save", "checkpoint_load", "boot_get", "boot_set", "memory_md", "stack_stats",
             "teleport_pack", "teleport_restore"}
WRITE_TOOLS = {"memory_remember": {"content": "A note"}, "memory_forget": {"memory_id": str(uuid.uuid4())},
               "memory_recover": {"memory_id": str(uuid.uuid4())}, "checkpoint_save": {"task": "Fractions unit"},
               "boot_set": {"key": "tone", "value": "warm"}, "teleport_pack": {}}
READ_TOOLS = {"memory_search": {"query": "fractions"}, "memory_load": {},
              "memory_get": {"memory_id": str(uuid.uuid4())}, "checkpoint_load": {}, "boot_get": {}, "memory_md": {},
              "stack_stats": {}, "teleport_restore": {}}
PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"
AUTH_HEADER = "curl -H 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig' https://api.example"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "test", "version": "1"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """uvicorn serving memoryhub.asgi with lifespan events on; its base URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("mcp") / "web.log"
    process = ManagedProcess(
        name="web",
        argv=[sys.executable, "-m", "uvicorn", "memoryhub.asgi:application", "--host", "127.0.0.1",
              "--port", str(port), "--workers", "1", "--no-access-log", "--lifespan", "on"],
        env=dict(os.environ, DATABASE_URL=database_url_for_processes()), cwd=BASE_DIR, log_path=log,
    )
    process.start()
    try:
        wait_for_health(f"http://127.0.0.1:{port}", alive=process.running, log=log, timeout=90)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.stop()


# --- the client -------------------------------------------------------------------------------------

async def _in_session(base: str, secret: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {secret}"}) as http, \
            streamable_http_client(f"{base}/mcp", http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        results: list[Any] = []
        for name, arguments in calls:
            results.append(await session.list_tools() if name == "tools/list"
                           else await session.call_tool(name, arguments))
        return results


def call(base: str, secret: str, name: str, /, **arguments: Any) -> types.CallToolResult:
    """One tool call in its own MCP session (the server is stateless: any call may go anywhere)."""
    result = asyncio.run(_in_session(base, secret, [(name, arguments)]))[0]
    assert isinstance(result, types.CallToolResult)
    return result


def ok(result: types.CallToolResult) -> Any:
    assert not result.is_error, result.content
    return result.structured_content


def error(result: types.CallToolResult) -> dict[str, Any]:
    """The REST error contract carried by a tool error: `{"error": {code, message, fields}, "status"}`."""
    assert result.is_error, result.structured_content
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    assert json.loads(text.text) == result.structured_content  # the model reads the same JSON
    return result.structured_content


def tool_names(base: str, secret: str) -> dict[str, dict[str, Any]]:
    listed = asyncio.run(_in_session(base, secret, [("tools/list", {})]))[0]
    return {tool.name: tool.input_schema for tool in listed.tools}


# --- tests ------------------------------------------------------------------------------------------

def test_every_tool_is_listed_with_a_json_schema_and_a_description(server: str) -> None:
    org = make_org()
    _, secret = make_key(org, stack=make_stack(org, "ada"))
    listed = asyncio.run(_in_session(server, secret, [("tools/list", {})]))[0]
    assert {tool.name for tool in listed.tools} == ALL_TOOLS
    for tool in listed.tools:
        assert tool.input_schema["type"] == "object" and "stack" in tool.input_schema["properties"], tool.name
        assert tool.description and len(tool.description) > 30, tool.name


def test_remember_search_load_checkpoint_export_and_stats_round_trip(server: str) -> None:
    org = make_org()
    stack = make_stack(org, "ada")
    _, secret = make_key(org, stack=stack)
    remembered = ok(call(server, secret, "memory_remember", content="Ada understood fractions with pizza slices",
                         tags=["math"]))
    assert remembered["decision"] == "create"
    memory_id = remembered["memory"]["id"]

    found = ok(call(server, secret, "memory_search", query="pizza fractions"))
    assert [hit["id"] for hit in found["results"]] == [memory_id]
    loaded = ok(call(server, secret, "memory_load", budget=2000))
    assert memory_id in [item["id"] for item in loaded["memories"]]
    assert ok(call(server, secret, "memory_get", memory_id=memory_id))["text"] == (
        "Ada understood fractions with pizza slices")

    saved = ok(call(server, secret, "checkpoint_save", task="Fractions unit, lesson 3", next_step="Decimals"))
    latest = ok(call(server, secret, "checkpoint_load"))
    assert latest["id"] == saved["id"] and latest["task"] == "Fractions unit, lesson 3"
    assert latest["next_step"] == "Decimals"
    assert ok(call(server, secret, "boot_set", key="tone", value="encouraging"))["value"] == "encouraging"
    assert ok(call(server, secret, "boot_get", key="tone"))["value"] == "encouraging"
    assert ok(call(server, secret, "memory_load"))["boot_config"] == {"tone": "encouraging"}

    # MEMORY.md holds the values, goals, beliefs and relationships (notes stay searchable), as on REST.
    belief = ok(call(server, secret, "memory_remember", kind="belief", statement="Pictures help Ada most",
                     confidence=0.9))
    assert belief["memory"]["kind"] == "belief"
    md = call(server, secret, "memory_md")
    assert isinstance(md.content[0], types.TextContent) and not md.is_error
    assert "Pictures help Ada most" in md.content[0].text and "**tone**: encouraging" in md.content[0].text
    stats = ok(call(server, secret, "stack_stats"))
    assert stats["by_kind"]["note"]["count"] == 1 and stats["by_kind"]["belief"]["count"] == 1
    assert stats["memories"] == 2 and stats["bytes"] > 0
    assert stats["last_write_at"] is not None

    assert ok(call(server, secret, "memory_forget", memory_id=memory_id, reason="test"))["forgotten"] is True
    assert ok(call(server, secret, "memory_search", query="pizza fractions"))["results"] == []
    assert ok(call(server, secret, "memory_recover", memory_id=memory_id))["forgotten"] is False


def test_a_school_key_names_the_stack_and_its_grants_apply(server: str) -> None:
    org = make_org()
    stack = make_stack(org, "ada")
    _, school_secret = make_key(org)
    missing = error(call(server, school_secret, "stack_stats"))
    assert missing["status"] == 400 and "stack" in missing["error"]["fields"]
    remembered = ok(call(server, school_secret, "memory_remember", stack="ada", content="Ada reads well"))
    assert Memory.objects.get(pk=remembered["memory"]["id"]).stack_id == stack.pk
    assert ok(call(server, school_secret, "stack_stats", stack="ada"))["memories"] == 1


def test_a_stack_bound_key_cannot_reach_another_stack_through_any_tool(server: str) -> None:
    org = make_org()
    own, other = make_stack(org, "ada"), make_stack(org, "bo")
    _, secret = make_key(org, stack=own)
    _, other_secret = make_key(org, stack=other)
    theirs = ok(call(server, other_secret, "memory_remember", content="Bo's private note about reading"))["memory"]
    for name, arguments in {**WRITE_TOOLS, **READ_TOOLS}.items():
        refused = error(call(server, secret, name, stack="bo", **arguments))
        assert (refused["status"], refused["error"]["code"]) == (404, "stack_not_found"), name
    # The other stack's memory by id, through the key's own stack: not found, and untouched.
    for name in ("memory_get", "memory_forget", "memory_recover"):
        refused = error(call(server, secret, name, memory_id=theirs["id"]))
        assert refused["error"]["code"] == "memory_not_found", name
    assert Memory.objects.get(pk=theirs["id"]).forgotten_at is None
    assert ok(call(server, secret, "stack_stats"))["memories"] == 0


def test_another_schools_key_reaches_nothing(server: str) -> None:
    org, other_org = make_org(), make_org()
    make_stack(org, "ada")
    _, stranger = make_key(other_org)
    for name, arguments in {**WRITE_TOOLS, **READ_TOOLS}.items():
        refused = error(call(server, stranger, name, stack="ada", **arguments))
        assert refused["error"]["code"] == "stack_not_found", name
    assert not Memory.objects.exists()


def test_a_read_only_key_is_offered_no_write_tool_and_every_write_tool_refuses(server: str) -> None:
    org = make_org()
    stack = make_stack(org, "ada")
    _, secret = make_key(org, stack=stack, read_only=True)
    assert set(tool_names(server, secret)) == ALL_TOOLS - set(WRITE_TOOLS)
    for name, arguments in WRITE_TOOLS.items():
        refused = error(call(server, secret, name, **arguments))
        assert (refused["status"], refused["error"]["code"]) == (403, "read_only_key"), name
    assert not Memory.objects.exists()
    assert error(call(server, secret, "checkpoint_load"))["error"]["code"] == "no_checkpoint"  # reads still work


@pytest.mark.parametrize("secret_text", [PRIVATE_KEY, AUTH_HEADER], ids=["private_key", "authorization_header"])
def test_a_secret_is_refused_like_on_rest(server: str, secret_text: str) -> None:
    org = make_org()
    stack = make_stack(org, "ada")
    _, secret = make_key(org, stack=stack)
    rest = bearer_client(secret).post("/api/v1/stacks/ada/ingest", {"kind": "note", "content": secret_text},
                                      format="json")
    refused = error(call(server, secret, "memory_remember", content=secret_text))
    assert rest.status_code == refused["status"] == 422
    assert refused["error"] == rest.json()["error"] and refused["error"]["code"] == "redaction_refused"
    assert not Memory.objects.filter(stack=stack).exists()


def test_bad_arguments_are_a_400_naming_the_field(server: str) -> None:
    org = make_org()
    _, secret = make_key(org, stack=make_stack(org, "ada"))
    refused = error(call(server, secret, "memory_search", query="x", limit="many", colour="red"))
    assert refused["status"] == 400 and refused["error"]["code"] == "invalid"
    assert set(refused["error"]["fields"]) == {"limit", "non_field_errors"}
    unknown = error(call(server, secret, "memory_remember", content="x", priorty=3))
    assert unknown["error"]["code"] == "unknown_field"


def test_no_key_or_a_bad_key_is_a_401_from_the_transport(server: str) -> None:
    bare = httpx.post(f"{server}/mcp", json=INITIALIZE, headers=MCP_HEADERS)
    assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer"
    assert bare.json()["error"]["code"] == "not_authenticated"
    bad = httpx.post(f"{server}/mcp/", json=INITIALIZE,
                     headers={**MCP_HEADERS, "Authorization": "Bearer knl_sk_" + "x" * 40})
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(Exception):  # noqa: B017 - the official client fails to initialize, whatever it raises
        asyncio.run(_in_session(server, "knl_sk_" + "y" * 40, [("tools/list", {})]))


def test_a_get_for_an_event_stream_is_refused_not_held_open(server: str) -> None:
    """The server is stateless: a GET asking for a server-to-client stream (or a DELETE ending a
    session) is a 405 with `Allow: POST` in the error contract, at once, with a key or without."""
    org = make_org()
    _, secret = make_key(org, stack=make_stack(org, "ada"))
    stream = {"Accept": "text/event-stream"}
    for method, headers in (("GET", {**stream, "Authorization": f"Bearer {secret}"}), ("GET", stream),
                            ("DELETE", {"Authorization": f"Bearer {secret}"})):
        response = httpx.request(method, f"{server}/mcp", headers=headers, timeout=5)
        assert response.status_code == 405 and response.headers["allow"] == "POST", (method, response.text)
        assert response.json()["error"]["code"] == "method_not_allowed"
    # The official client still works against it (it opens no stream on a stateless server).
    assert "memory_search" in tool_names(server, secret)


def test_a_foreign_host_or_origin_is_refused(server: str) -> None:
    org = make_org()
    _, secret = make_key(org, stack=make_stack(org, "ada"))
    auth = {**MCP_HEADERS, "Authorization": f"Bearer {secret}"}
    assert httpx.post(f"{server}/mcp", json=INITIALIZE, headers=auth).status_code == 200
    assert httpx.post(f"{server}/mcp", json=INITIALIZE, headers={**auth, "Host": "evil.example"}).status_code == 421
    foreign = httpx.post(f"{server}/mcp", json=INITIALIZE, headers={**auth, "Origin": "https://evil.example"})
    assert foreign.status_code == 403
    same = httpx.post(f"{server}/mcp", json=INITIALIZE, headers={**auth, "Origin": "http://localhost:8000"})
    assert same.status_code == 200


def test_teleport_tools_give_links_that_work_with_the_same_key(server: str) -> None:
    org = make_org()
    _, secret = make_key(org, stack=make_stack(org, "ada"))
    pack = ok(call(server, secret, "teleport_pack", name="laptop"))
    upload = pack["upload"]
    assert upload["url"] == f"{server}/api/v1/stacks/ada/snapshots?name=laptop" and upload["method"] == "POST"
    assert secret not in json.dumps(pack)  # the key is never echoed
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("notes.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    stored = httpx.post(upload["url"], content=buffer.getvalue(),
                        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/gzip"})
    assert stored.status_code == 201, stored.text
    restore = ok(call(server, secret, "teleport_restore"))
    assert restore["snapshot"]["id"] == stored.json()["id"]
    archive = httpx.get(restore["download"]["url"], headers={"Authorization": f"Bearer {secret}"})
    assert archive.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(archive.content), mode="r:gz") as tar:  # re-packed clean by teleport
        member = tar.extractfile("notes.txt")
        assert member is not None and member.read() == b"hello"
