"""The Python client (clients/python, `memoryhub_client`) against a live MemoryHub on the test
database: a sync and an async scenario over every call family, search by meaning, a 429 retried
after its Retry-After, the error contract as exceptions, isolation, the schema-drift checks (the
models' fields and every route the client calls), the README's snippet, and a clean
`pip install ./clients/python` (docs/api.md §1, clients/python/README.md)."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import subprocess
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

import httpx
import pytest
from memoryhub_client import AsyncMemoryHub, MemoryHub, NotFound, UnknownField, _calls
from memoryhub_client._calls import Call
from memoryhub_client.models import SCHEMA_COMPONENTS

from memories.models import Memory
from memories.search.embedding_jobs import memories_embed
from tests.actors import School
from tests.factories import make_stack

pytestmark = pytest.mark.django_db(transaction=True)

BASE_DIR = Path(__file__).resolve().parent.parent.parent

# One memory of every kind, with the fields each kind requires (and one optional one).
EVERY_KIND: dict[str, dict[str, Any]] = {
    "raw": {"content": "Ada asked why a half is bigger than a third"},
    "episode": {"objective": "Practise fractions", "outcome": "Solved 8 of 10", "lessons": ["Draw the pie first"]},
    "note": {"content": "Fractions click with pizza diagrams", "tags": ["math"]},
    "belief": {"statement": "Pictures help Ada with fractions", "confidence": 0.9},
    "value": {"name": "curiosity", "statement": "Ask why before how"},
    "goal": {"title": "Master fractions", "priority": "high", "extra": {"term": "spring"}},
    "drive": {"drive_type": "growth", "intensity": 0.7},
    "relationship": {"entity_name": "Ms Rivera", "notes": "Maths teacher"},
    "playbook": {"name": "Fraction warm-up", "description": "Start every lesson with a pizza sketch"},
}


def test_sync_client_covers_what_an_agent_does(hub_url: str, school: School, other_school: School) -> None:
    with MemoryHub(hub_url, school.agent_secret, agent_id="tutor-7") as hub:
        stored = {kind: hub.remember("alice", kind=kind, **fields) for kind, fields in EVERY_KIND.items()}
        assert {kind: memory["kind"] for kind, memory in stored.items()} == {kind: kind for kind in EVERY_KIND}
        assert stored["goal"]["extra"] == {"term": "spring"}
        assert stored["note"]["written_by"]["agent"] == "tutor-7"

        batch = hub.batch("alice", [{"kind": "note", "content": "Likes the number seven"},
                                    {"kind": "note", "content": "Reads comics at lunch"}])
        assert batch["created"] == 2

        note = stored["note"]
        changed = hub.update("alice", note["id"], tags=["math", "visual"])
        assert changed["tags"] == ["math", "visual"]
        detail = hub.get("alice", note["id"])
        assert detail["tags"] == ["math", "visual"] and detail["revisions"]
        assert hub.forget("alice", note["id"], reason="test")["forgotten"] is True
        assert hub.recover("alice", note["id"])["forgotten"] is False

        # A list is an iterator over cursor pages: 11 memories in pages of 4.
        listed = list(hub.memories("alice", page_size=4))
        assert len(listed) == 11 and len({m["id"] for m in listed}) == 11
        assert [m["id"] for m in hub.memories("alice", kinds=["belief"])] == [stored["belief"]["id"]]

        # Checkpoint round trip; the load carries it and stays within its budget.
        assert hub.checkpoint_latest("alice") is None
        saved = hub.checkpoint_save("alice", "Fractions unit, lesson 3", pending=["Mark the quiz"],
                                    context="Halfway through equivalent fractions")
        latest = hub.checkpoint_latest("alice")
        assert latest is not None and latest["id"] == saved["id"]
        assert (latest["task"], latest["pending"], latest["context"]) == (
            "Fractions unit, lesson 3", ["Mark the quiz"], {"text": "Halfway through equivalent fractions"})
        assert [c["id"] for c in hub.checkpoint_history("alice")] == [saved["id"]]
        loaded = hub.load("alice", budget=300)
        assert loaded["meta"]["budget_total"] == 300 and 0 < loaded["meta"]["budget_used"] <= 300
        assert loaded["checkpoint"] is not None and loaded["checkpoint"]["task"] == "Fractions unit, lesson 3"
        assert loaded["memories"]

        hub.boot_set("alice", "tone", "encouraging")
        assert hub.boot_get("alice", "tone") == "encouraging"
        assert hub.boot_config("alice") == {"tone": "encouraging"}
        hub.boot_delete("alice", "tone")
        assert hub.boot_get("alice", "tone") is None

        assert "Pictures help Ada with fractions" in hub.memory_md("alice")
        ingested = hub.ingest("alice", kind="note", content="Fractions click with pizza diagrams")
        assert ingested["decision"] in {"create", "reinforce", "update", "supersede"}
        session = hub.save_session("alice", "s-1", summary="We practised fractions. Decided: use pizza.",
                                   tool_name="tutor", success=True)
        assert session["stored"] is True and session["card"]["title"]

        # Native sync: push, then pull everything with the cursor, page by page.
        pushed = hub.sync_push("alice", [{"op": "upsert", "kind": "note", "record_id": "device-1",
                                          "data": {"content": "Pushed from a device"}}])
        assert (pushed["applied"], pushed["rejected"]) == (1, 0)
        cursor, changes = None, []
        while True:
            pulled = hub.sync_pull("alice", cursor=cursor, limit=5)
            changes += pulled["changes"]
            cursor = pulled["next_cursor"]
            if not pulled["has_more"]:
                break
        assert "device-1" in {change["record_id"] for change in changes}
        assert hub.sync_pull("alice", cursor=cursor)["changes"] == []

        # The error contract as exceptions: a misspelt field names itself; another school is a 404.
        with pytest.raises(UnknownField) as typo:
            hub.remember("alice", kind="goal", title="Decimals", priorty="high")
        assert typo.value.status == 400 and typo.value.code == "unknown_field"
        assert "priorty" in typo.value.fields and "priority" in str(typo.value.fields["priorty"])
        with pytest.raises(NotFound) as elsewhere:
            hub.load("carol")
        assert (elsewhere.value.status, elsewhere.value.code) == (404, "stack_not_found")
    assert not Memory.objects.filter(stack=school.stack, kind="goal", text__contains="Decimals").exists()

    # The school's calls, with the school key: stacks and keys; still nothing of the other school.
    with MemoryHub(hub_url, school.admin_secret) as admin:
        assert {s["stack_id"] for s in admin.stacks()} == {"alice", "bob"}
        created = admin.create_stack("ben", display_name="Ben")
        assert created["stack_id"] == "ben" and admin.stack("ben")["display_name"] == "Ben"
        issued = admin.issue_key("ben's tutor", stack_id="ben")
        assert issued["key"].startswith("knl_sk_")
        assert issued["key_id"] in {k["key_id"] for k in admin.keys(page_size=1)}
        with MemoryHub(hub_url, issued["key"]) as ben:
            assert ben.remember("ben", content="First day")["kind"] == "note"
        admin.revoke_key(issued["key_id"])
        across = admin.search_school("pizza diagrams", limit=5)["results"]
        assert across and {hit["stack"] for hit in across} == {"alice"}
        assert admin.search_school("pizza", stacks=["bob"])["results"] == []
        for call in (lambda: admin.stack("carol"), lambda: admin.search("carol", "pizza"),
                     lambda: admin.search_school("pizza", stacks=["carol"])):
            with pytest.raises(NotFound):
                call()


def test_async_client_covers_the_same_calls(hub_url: str, school: School, other_school: School) -> None:
    async def scenario() -> None:
        async with AsyncMemoryHub(hub_url, school.agent_secret, agent_id="tutor-async") as hub:
            for kind, fields in EVERY_KIND.items():
                assert (await hub.remember("alice", kind=kind, **fields))["kind"] == kind
            listed = [m["kind"] async for m in hub.memories("alice", page_size=4)]
            assert sorted(listed) == sorted(EVERY_KIND)
            found = await hub.search("alice", "pizza diagrams", limit=5)
            assert found["results"][0]["text"] == "Fractions click with pizza diagrams"
            assert found["results"][0]["keyword_score"] is not None
            assert await hub.checkpoint_latest("alice") is None
            saved = await hub.checkpoint_save("alice", "Decimals, lesson 1", next_step="Place value")
            latest = await hub.checkpoint_latest("alice")
            assert latest is not None and (latest["id"], latest["next_step"]) == (saved["id"], "Place value")
            loaded = await hub.load("alice", budget=200)
            assert loaded["meta"]["budget_used"] <= 200
            pulled = await hub.sync_pull("alice")
            assert len(pulled["changes"]) == len(EVERY_KIND)
            with pytest.raises(UnknownField) as typo:
                await hub.remember("alice", kind="note", contnet="typo")
            assert "contnet" in typo.value.fields
            with pytest.raises(NotFound):
                await hub.remember("carol", content="not yours")
    asyncio.run(scenario())


@pytest.mark.slow  # the real embedding model, loaded once per test process
def test_search_finds_a_memory_by_meaning(hub_url: str, school: School, settings: Any) -> None:
    # The real model (docs/algorithms.md §10.1), embedding synchronously here instead of a worker.
    from memories.search.embedding_model import deployment_model_switch
    from memories.search.embeddings import get_embedder

    settings.EMBEDDING_PROVIDER = "minilm"
    deployment_model_switch(get_embedder().model_id)
    facts = ["Ada understands fractions much better when the teacher cuts a pizza into equal slices.",
             "Ada walks her grandmother's dog every afternoon after school.",
             "Ada plays the violin in the school orchestra on Thursdays."]
    with MemoryHub(hub_url, school.agent_secret) as hub:
        ids = [hub.remember("alice", content=fact)["id"] for fact in facts]
        assert memories_embed(ids=ids).embedded == 3
        found = hub.search("alice", "Which musical instrument does she play?", limit=3)

    async def ask_async() -> list[str]:
        async with AsyncMemoryHub(hub_url, school.agent_secret) as hub:
            hits = (await hub.search("alice", "Who does she look after in the afternoons?", limit=3))["results"]
            return [hit["id"] for hit in hits]
    top = found["results"][0]
    assert top["id"] == ids[2]
    assert top["semantic_score"] is not None and top["match_type"] in {"semantic", "both"}
    assert {"combined_score", "fused_score", "retention", "boosts"} <= top.keys()
    assert asyncio.run(ask_async())[0] == ids[1]


def test_a_429_is_retried_after_its_retry_after(hub_url: str, school: School, settings: Any) -> None:
    # One request per second per key: the second call of a burst is refused with Retry-After: 1.
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                               "DEFAULT_THROTTLE_RATES": {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"],
                                                          "request": "1/s"}}
    statuses: list[tuple[int, str | None]] = []
    http = httpx.Client(event_hooks={"response": [
        lambda response: statuses.append((response.status_code, response.headers.get("Retry-After")))]})
    with MemoryHub(hub_url, school.agent_secret, http_client=http, max_retries=3, max_backoff=5) as hub:
        for _ in range(3):  # a burst may straddle a second boundary; three calls cannot all do so
            hub.boot_config("alice")
            if any(status == 429 for status, _ in statuses):
                break
    http.close()
    refused = statuses.index(next(s for s in statuses if s[0] == 429))
    assert statuses[refused] == (429, "1")
    assert statuses[refused + 1][0] == 200  # the same call, retried after the wait, went through


def test_models_match_the_live_openapi_schema(hub_url: str) -> None:
    """Drift fails here: every key of every mirrored component, its type and whether it is required."""
    components = httpx.get(f"{hub_url}/api/schema/", params={"format": "json"}, timeout=60).json()["components"]
    schemas = components["schemas"]
    problems: list[str] = []
    for name, model in SCHEMA_COMPONENTS.items():
        schema = schemas[name]
        hints = typing.get_type_hints(model)
        properties = schema.get("properties", {})
        if set(hints) != set(properties):
            problems.append(f"{name}: client {sorted(set(hints) - set(properties))} "
                            f"schema {sorted(set(properties) - set(hints))}")
            continue
        required = set(schema.get("required", []))
        if required != set(model.__required_keys__):  # type: ignore[attr-defined]
            problems.append(f"{name}: required {sorted(required)} vs {sorted(model.__required_keys__)}")  # type: ignore[attr-defined]
        for key, spec in properties.items():
            expected = _python_type(spec, schemas)
            if hints[key] != expected:
                problems.append(f"{name}.{key}: client {hints[key]} schema {expected}")
    assert not problems, "\n".join(problems)


# One call of every request builder in memoryhub_client._calls, with sample arguments.
EVERY_CALL: dict[str, Call[Any]] = {
    "remember": _calls.remember("s", "note", {}), "batch": _calls.batch("s", []), "get": _calls.get("s", "m"),
    "update": _calls.update("s", "m", {}), "forget": _calls.forget("s", "m", "r"), "recover": _calls.recover("s", "m"),
    "protect": _calls.protect("s", "m", True),
    "memories": _calls.memories("s", kinds=None, tags=None, forgotten=None, created_after=None, created_before=None,
                                page_size=None),
    "search": _calls.search("s", "q", 10, {}), "search_school": _calls.search_school("q", 10, None, {}),
    "load": _calls.load("s", 8000, None, False), "memory_md": _calls.memory_md("s"),
    "ingest": _calls.ingest("s", "note", {}),
    "session": _calls.session("s", "id", {}), "checkpoint_save": _calls.checkpoint_save("s", {}),
    "checkpoint_latest": _calls.checkpoint_latest("s"), "checkpoint_history": _calls.checkpoint_history("s", None),
    "boot_config": _calls.boot_config("s"), "boot_get": _calls.boot_get("s", "k"),
    "boot_set": _calls.boot_set("s", "k", "v"),
    "boot_delete": _calls.boot_delete("s", "k"), "sync_push": _calls.sync_push("s", []),
    "sync_pull": _calls.sync_pull("s", None, None), "stacks": _calls.stacks(None), "stack_get": _calls.stack_get("s"),
    "stack_create": _calls.stack_create("s", "", "student"), "keys": _calls.keys(None),
    "key_issue": _calls.key_issue({}),
    "key_revoke": _calls.key_revoke("k"), "key_cycle": _calls.key_cycle("k"),
}


def test_every_call_the_client_makes_is_a_route_of_the_live_schema(hub_url: str) -> None:
    """The other half of drift: each request builder's method and path is an operation of /api/schema/."""
    builders = {name for name, function in vars(_calls).items()
                if inspect.isfunction(function) and str(function.__annotations__.get("return", "")).startswith("Call[")
                and name not in ("page", "next_page")}  # the pages of a list, not routes of their own
    assert builders == set(EVERY_CALL), "add the new builder to EVERY_CALL"
    paths = httpx.get(f"{hub_url}/api/schema/", params={"format": "json"}, timeout=60).json()["paths"]
    routes = [(re.compile("^" + re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(path)) + "$"), {m.upper() for m in ops})
              for path, ops in paths.items()]
    missing = [f"{name}: {call.method} {call.path}" for name, call in EVERY_CALL.items()
               if not any(pattern.match(call.path) and call.method in methods for pattern, methods in routes)]
    assert not missing, missing


_PRIMITIVES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool}


def _python_type(spec: dict[str, Any], schemas: dict[str, Any]) -> Any:
    """The annotation a schema property should have in memoryhub_client.models."""
    if "allOf" in spec and len(spec["allOf"]) == 1:
        spec = {**spec["allOf"][0], **{k: v for k, v in spec.items() if k != "allOf"}}
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[1]
        target = schemas[name]
        base: Any = (SCHEMA_COMPONENTS[name] if name in SCHEMA_COMPONENTS
                     else str if "enum" in target else dict[str, Any])
    elif spec.get("type") in _PRIMITIVES:
        base = _PRIMITIVES[spec["type"]]
    elif spec.get("type") == "array":
        base = list[_python_type(spec.get("items", {}), schemas)]  # type: ignore[misc]
    elif spec.get("type") == "object":
        base = dict[str, Any]
    else:
        return Any  # any JSON value
    return base | None if spec.get("nullable") else base


def test_the_readme_snippet_runs_as_written(hub_url: str, school: School) -> None:
    """README.md "Connect your agent": its ```python block, run with MEMORYHUB_URL/KEY set to the
    school key of a school with the stack "ada" (as after "First five minutes")."""
    make_stack(school.org, "ada")
    text = (BASE_DIR / "README.md").read_text()
    section = text.split("\n## Connect your agent\n", 1)[1].split("\n## ", 1)[0]
    [snippet] = [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)\n *```", section, re.S)]
    env = dict(os.environ, MEMORYHUB_URL=hub_url, MEMORYHUB_KEY=school.admin_secret,
               NO_PROXY="127.0.0.1,localhost")
    done = subprocess.run([sys.executable, "-c", snippet], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Fractions click with pizza diagrams" in done.stdout


@pytest.mark.slow
@pytest.mark.django_db(transaction=False)
def test_pip_install_into_a_fresh_venv(tmp_path: Path) -> None:
    """`pip install ./clients/python` from a clean environment, as the README says, then import it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "--quiet",
                          str(BASE_DIR / "clients" / "python")], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import memoryhub_client, pathlib; "
                            "print(memoryhub_client.MemoryHub.__name__, memoryhub_client.__file__); "
                            "print((pathlib.Path(memoryhub_client.__file__).parent / 'py.typed').exists())"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    name, path = probe.stdout.split("\n")[0].split(" ", 1)
    assert name == "MemoryHub" and str(venv) in path  # the installed copy, not the source tree
    assert probe.stdout.split("\n")[1] == "True"

