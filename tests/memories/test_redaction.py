"""Redaction at ingest (docs/algorithms.md §11): a canary through every write path leaves no raw
value in the stored row, its full-text vector, its revisions or its embedding input; a CRITICAL
secret through every path stores nothing and gets the right error."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import uuid
import zipfile
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.test import override_settings

from accounts.throttles import throttle_state_clear
from memories.events import event_dict
from memories.models import BootConfigEntry, ChangeEvent, Checkpoint, Memory, MemoryRevision
from memories.redaction import (
    PII_CATEGORIES,
    redact_text,
    redact_value,
    redaction_categories_validated,
)
from memories.search.embedding_jobs import memories_embed
from memories.search.embeddings import HashEmbedder, Vector
from memoryhub.errors import InvalidInput
from memoryhub.logsafety import SafeFormatter
from tests.actors import School
from tests.factories import bearer_client, make_key, sql_values
from tests.webhooks.conftest import make_endpoint
from webhooks import dispatch
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.django_db

EMAIL = "ada.mum@example.org"
PHONE = "555-867-5309"
AWS = "AKIAIOSFODNN7EXAMPLE"
KNL = "knl_sk_" + "0123456789abcdef" * 2
CARD = "4111 1111 1111 1111"  # passes the Luhn check
RAW_VALUES = (EMAIL, PHONE, AWS, KNL, CARD, "ada.mum", "867-5309", "IOSFODNN7", "0123456789abcdef", "4111 1111")
CANARY = f"Call Ada's mum on {PHONE} or {EMAIL}; she pasted {AWS}, {KNL} and card {CARD} by mistake."
PLACEHOLDERS = ("<REDACTED:EMAIL>", "<REDACTED:PHONE>", "<REDACTED:AWS_ACCESS_KEY>", "<REDACTED:KNL_API_KEY>",
                "<REDACTED:CREDIT_CARD>")

PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"
AUTH_HEADER = "curl -H 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig' https://api.example"
CRITICAL = [("ssh_private_key", PRIVATE_KEY), ("auth_header", AUTH_HEADER)]


@pytest.fixture(autouse=True)
def fresh_throttles() -> Iterator[None]:
    throttle_state_clear()
    yield


class RecordingEmbedder(HashEmbedder):
    """The test embedder, also keeping every text it was given: the embedding input."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[str] = []

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        self.inputs.extend(texts)
        return super().embed(texts)


def _everything_stored(stack_id: int) -> str:
    """Every stored trace of a stack's memories, checkpoints and boot config, as text: rows (all
    columns), the full-text vectors, revision snapshots."""
    parts: list[Any] = []
    parts += sql_values("SELECT row_to_json(m)::text FROM memories_memory m WHERE stack_id = %s", [stack_id])
    parts += sql_values("SELECT search_vector::text FROM memories_memory WHERE stack_id = %s", [stack_id])
    parts += sql_values("SELECT row_to_json(r)::text FROM memories_memoryrevision r JOIN memories_memory m "
                        "ON m.id = r.memory_id WHERE m.stack_id = %s", [stack_id])
    parts += sql_values("SELECT row_to_json(c)::text FROM memories_checkpoint c WHERE stack_id = %s", [stack_id])
    parts += sql_values("SELECT row_to_json(b)::text FROM memories_bootconfigentry b WHERE stack_id = %s",
                        [stack_id])
    return "\n".join(str(p) for p in parts)


def _assert_clean(text: str) -> None:
    lowered = text.lower()
    for raw in RAW_VALUES:
        assert raw.lower() not in lowered, f"a raw value survived: {raw[:4]}…"


def _kernle_op(record_id: str, content: str) -> dict[str, Any]:
    data = {"id": record_id, "content": content, "note_type": "note", "tags": ["family"],
            "local_updated_at": "2026-11-21T23:00:00+00:00", "version": 1, "mood": content}
    return {"operation": "update", "table": "notes", "record_id": record_id,
            "local_updated_at": "2026-11-21T23:00:00+00:00", "version": 1, "data": data}


def _native_op(record_id: str, content: str) -> dict[str, Any]:
    return {"op": "upsert", "kind": "note", "record_id": record_id, "updated_at": "2026-11-21T23:00:00+00:00",
            "data": {"content": content, "tags": ["family"], "mood": content}}


# --- the function -----------------------------------------------------------------------------------

def test_rules_replace_with_typed_placeholders_and_report_counts_never_values() -> None:
    counts: Counter[str] = Counter()
    out = redact_value({"a": CANARY, "b": [EMAIL, {"c": f"ip 10.0.0.12, token ghp_{'a' * 36}"}]}, counts=counts)
    flat = str(out)
    _assert_clean(flat)
    for placeholder in (*PLACEHOLDERS, "<REDACTED:IP_ADDRESS>", "<REDACTED:GITHUB_TOKEN>"):
        assert placeholder in flat
    assert counts["email"] == 2 and counts["credit_card"] == 1
    # Not everything that looks like a number is a secret: a failed Luhn check, a score, a version.
    for clean in ("4111 1111 1111 1112", "scored 8 of 10 in 2024", "the bearer of bad news", "v2.3.1"):
        assert redact_text(clean) == clean
    assert redact_text("api_key=" + "x" * 40) == "api_key=<REDACTED:API_KEY>"
    assert redact_text("sk-proj-" + "a1" * 12) == "<REDACTED:SK_SECRET_KEY>"
    assert redact_text("xoxb-1234567890-abcdef") == "<REDACTED:SLACK_TOKEN>"


# --- the canary through every write path ------------------------------------------------------------

def test_canary_through_every_write_path_leaves_no_raw_value(school: School) -> None:
    client, base = school.agent, f"/api/v1/stacks/{school.stack.slug}"
    created = client.post(f"{base}/memories", {"kind": "note", "content": CANARY, "tags": [EMAIL],
                                               "extra": {"contact": {"phone": PHONE}}}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["redaction_report"] and {"rule": "email", "count": 2} in body["redaction_report"]
    for placeholder in PLACEHOLDERS:
        assert placeholder in body["text"]
    # A patch: the stored text and the revision of the state before it.
    patched = client.patch(f"{base}/memories/{body['id']}", {"content": f"Now {CANARY}"}, format="json")
    assert patched.status_code == 200, patched.content
    assert patched.json()["redaction_report"]
    assert client.post(f"{base}/memories/batch", {"items": [
        {"kind": "belief", "statement": CANARY}, {"kind": "episode", "objective": CANARY, "outcome": "ok",
                                                 "lessons": [CANARY]}]}, format="json").status_code == 201
    kernle = client.post("/sync/push", {"stack_id": school.stack.slug, "operations": [_kernle_op("k1", CANARY)]},
                         format="json")
    assert kernle.status_code == 200 and kernle.json()["synced"] == 1, kernle.content
    # A second kernle push of the same record merges list fields into the stored (redacted) record.
    again = _kernle_op("k1", CANARY)
    again["data"]["tags"] = ["family", PHONE]
    again["local_updated_at"] = again["data"]["local_updated_at"] = "2026-11-22T00:00:00+00:00"
    assert client.post("/sync/push", {"stack_id": school.stack.slug, "operations": [again]},
                       format="json").json()["synced"] == 1
    native = client.post(f"{base}/sync/push", {"operations": [_native_op("n1", CANARY)]}, format="json")
    assert native.status_code == 200 and native.json()["applied"] == 1, native.content
    ingested = client.post(f"{base}/ingest", {"kind": "note", "content": f"Ingested: {CANARY}"}, format="json")
    assert ingested.status_code == 201, ingested.content
    checkpoint = client.post(f"{base}/checkpoint", {"task": f"Call {PHONE}", "progress": CANARY,
                                                   "context": {"who": EMAIL, "keys": [AWS, KNL]}}, format="json")
    assert checkpoint.status_code in (200, 201), checkpoint.content
    assert client.put(f"{base}/boot-config/contact", {"value": CANARY}, format="json").status_code == 200

    memories = Memory.objects.filter(stack=school.stack)
    assert memories.count() == 6  # create, batch of 2, kernle, native, ingest
    assert all(m.redaction_report for m in memories)
    assert MemoryRevision.objects.filter(memory__stack=school.stack).exists()
    assert Checkpoint.objects.filter(stack=school.stack).exists()
    assert BootConfigEntry.objects.get(stack=school.stack, key="contact").value.count("<REDACTED:") == 5
    stored = _everything_stored(school.stack.pk)
    assert "REDACTED" in stored
    _assert_clean(stored)
    # What is derived and sent from it: MEMORY.md, the archive (every file in it), each live event
    # (the channel-layer message of every change event) and a webhook payload that includes text.
    memory_md = client.get(f"{base}/export/memory.md")
    assert memory_md.status_code == 200 and b"REDACTED" in memory_md.content
    _assert_clean(memory_md.content.decode())
    archive = school.admin_api.get(f"{base}/export/archive")
    assert archive.status_code == 200, archive.content[:300]
    with zipfile.ZipFile(io.BytesIO(b"".join(archive.streaming_content))) as zipped:  # type: ignore[attr-defined]
        names = zipped.namelist()
        files = "\n".join(zipped.read(name).decode() for name in names)
    assert len(names) > 2 and "REDACTED" in files
    _assert_clean(files)
    events = list(ChangeEvent.objects.filter(stack=school.stack))
    assert events
    _assert_clean(json.dumps([event_dict(event, school.stack.slug) for event in events]))
    with override_settings(WEBHOOKS_ALLOW_LOOPBACK_HTTP=True):  # never sent: the payload is built here
        endpoint, _ = make_endpoint(school.org, "http://127.0.0.1:9/hook", include_text=True)
    for event in events:
        dispatch.fan_out(event)
    payloads = json.dumps([dispatch.payload(delivery, endpoint)
                           for delivery in WebhookDelivery.objects.filter(endpoint=endpoint)])
    assert "<REDACTED:EMAIL>" in payloads
    _assert_clean(payloads)

    embedder = RecordingEmbedder()
    memories.update(embedded_version=None)  # smart ingest embedded its own already: embed them all here
    memories_embed(ids=[m.pk for m in memories], embedder=embedder)
    assert len(embedder.inputs) == 6
    _assert_clean("\n".join(embedder.inputs))
    # What the API and the pulls hand back is the redacted record too.
    _assert_clean(client.get(f"{base}/memories").content.decode())
    _assert_clean(client.post("/sync/pull", {"stack_id": school.stack.slug, "since": None},
                              format="json").content.decode())


def test_a_redacted_record_is_idempotent_and_keeps_its_report(school: School) -> None:
    client, base = school.agent, f"/api/v1/stacks/{school.stack.slug}"
    memory = client.post(f"{base}/memories", {"kind": "note", "content": CANARY}, format="json").json()
    report = memory["redaction_report"]
    tagged = client.patch(f"{base}/memories/{memory['id']}", {"tags": ["math"]}, format="json").json()
    assert tagged["redaction_report"] == report and tagged["text"] == memory["text"]


def test_preview_is_a_dry_run_with_the_create_access_decision(school: School, other_school: School) -> None:
    url = f"/api/v1/stacks/{school.stack.slug}/redaction/preview"
    response = school.agent.post(url, {"kind": "note", "content": CANARY}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["stored"] is False and {"rule": "knl_api_key", "count": 1} in body["redaction"]
    _assert_clean(response.content.decode())
    assert not Memory.objects.filter(stack=school.stack).exists()
    refused = school.agent.post(url, {"kind": "note", "content": PRIVATE_KEY}, format="json")
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "redaction_refused"
    # Another school's key cannot reach the stack: 404; a read-only key may not write it: 403 — as for a create.
    assert other_school.agent.post(url, {"kind": "note", "content": "x"}, format="json").status_code == 404
    _, read_only = make_key(school.org, stack=school.stack, read_only=True)
    assert bearer_client(read_only).post(url, {"kind": "note", "content": "x"}, format="json").status_code == 403


# --- CRITICAL: nothing stored, the right error ------------------------------------------------------

@pytest.mark.parametrize(("rule", "secret"), CRITICAL)
def test_critical_secret_is_refused_on_every_native_path(school: School, rule: str, secret: str) -> None:
    client, base = school.agent, f"/api/v1/stacks/{school.stack.slug}"
    existing = client.post(f"{base}/memories", {"kind": "note", "content": "fractions"}, format="json").json()
    attempts = [
        client.post(f"{base}/memories", {"kind": "note", "content": secret}, format="json"),
        client.post(f"{base}/memories", {"kind": "note", "content": "x", "extra": {"log": [secret]}}, format="json"),
        client.post(f"{base}/memories/batch", {"items": [{"kind": "note", "content": "fine"},
                                                         {"kind": "note", "content": secret}]}, format="json"),
        client.patch(f"{base}/memories/{existing['id']}", {"content": secret}, format="json"),
        client.post(f"{base}/ingest", {"kind": "note", "content": secret}, format="json"),
        client.post(f"{base}/checkpoint", {"task": "t", "context": {"note": secret}}, format="json"),
        client.put(f"{base}/boot-config/k", {"value": secret}, format="json"),
    ]
    for response in attempts:
        assert response.status_code == 422, response.content
        error = response.json()["error"]
        assert error["code"] == "redaction_refused" and rule in error["message"]
        assert secret not in response.content.decode() and "b3BlbnNz" not in response.content.decode()
    assert list(Memory.objects.filter(stack=school.stack).values_list("text", flat=True)) == ["fractions"]
    assert not Checkpoint.objects.filter(stack=school.stack).exists()
    assert not BootConfigEntry.objects.filter(stack=school.stack).exists()
    assert "b3BlbnNz" not in _everything_stored(school.stack.pk)


@pytest.mark.parametrize(("rule", "secret"), CRITICAL)
def test_critical_secret_in_a_push_is_that_operations_conflict_and_the_rest_applies(
        school: School, rule: str, secret: str) -> None:
    client, slug = school.agent, school.stack.slug
    kernle = client.post("/sync/push", {"stack_id": slug, "operations": [
        _kernle_op("ok1", "fractions"), _kernle_op("bad1", secret)]}, format="json")
    assert kernle.status_code == 200, kernle.content
    assert kernle.json()["synced"] == 1
    (conflict,) = kernle.json()["conflicts"]
    assert conflict["record_id"] == "bad1" and rule in str(conflict)
    native = client.post(f"/api/v1/stacks/{slug}/sync/push", {"operations": [
        _native_op("ok2", "decimals"), _native_op("bad2", secret)]}, format="json")
    assert native.status_code == 200 and native.json()["applied"] == 1, native.content
    assert rule in str(native.json())
    for body in (kernle.content.decode(), native.content.decode()):
        assert "b3BlbnNz" not in body and "eyJhbGciOiJIUzI1NiJ9" not in body
    assert sorted(Memory.objects.filter(stack=school.stack).values_list("record_id", flat=True)) == ["ok1", "ok2"]


def test_authorization_header_as_a_json_key_is_critical(school: School) -> None:
    response = school.agent.post(f"/api/v1/stacks/{school.stack.slug}/memories", {
        "kind": "note", "content": "request log", "extra": {"headers": {"Authorization": f"Bearer {uuid.uuid4()}"}}},
        format="json")
    assert response.status_code == 422 and response.json()["error"]["fields"] == {
        "extra.headers.Authorization": ["Matches the CRITICAL rule auth_header."]}


# --- logs -------------------------------------------------------------------------------------------

def _session_log_files() -> list[Path]:
    """Every log file of this test session: under its data dir's parent (the embedded Postgres' and
    Redis' logs, anything the app or a started process wrote there)."""
    data_dir = os.environ.get("MEMORYHUB_DATA_DIR")
    if not data_dir:
        return []
    root = Path(data_dir).parent
    return [path for path in root.rglob("*") if path.is_file() and (path.suffix == ".log" or "log" in path.parts)]


def test_no_raw_value_in_any_log(school: School, caplog: pytest.LogCaptureFixture) -> None:
    """The canary through the write paths, a database error whose message quotes it, and a logged
    traceback of one: neither the app's log records nor any log file of the session (embedded
    Postgres and Redis included) holds a raw value."""
    caplog.set_level(logging.DEBUG)
    client, base = school.agent, f"/api/v1/stacks/{school.stack.slug}"
    assert client.post(f"{base}/memories", {"kind": "note", "content": CANARY}, format="json").status_code == 201
    assert client.post("/sync/push", {"stack_id": school.stack.slug, "operations": [_kernle_op("k1", CANARY)]},
                       format="json").json()["synced"] == 1
    assert client.post(f"{base}/sync/push", {"operations": [_native_op("n1", CANARY)]},
                       format="json").json()["applied"] == 1
    # A failing statement carrying the raw text (its ERROR, STATEMENT and parameters are what
    # Postgres would log by default), and the app logging that error with its traceback.
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        try:
            cursor.execute("SELECT %s::int", [CANARY])
        except DatabaseError:
            logging.getLogger("memoryhub.errors").error("database error: %s", "DataError", exc_info=True)
            raise
    formatter = SafeFormatter("%(levelname)s %(name)s: %(message)s")
    _assert_clean("\n".join(formatter.format(record) for record in caplog.records))
    assert any("message withheld" in formatter.format(record) for record in caplog.records)
    files = _session_log_files()
    if not files:
        pytest.skip("external Postgres/Redis: their logs are not this session's")
    for path in files:
        _assert_clean(path.read_text(errors="replace"))


def test_a_failed_tasks_log_line_withholds_the_database_error() -> None:
    """Celery's failure line quotes the error (`%(exc)s`) and logs its traceback: with the settings'
    filter and formatter (which the worker uses too, memoryhub/celery.py) neither holds the row."""
    import psycopg
    from django.conf import settings
    from django.db import IntegrityError

    from memoryhub.logsafety import WithholdDatabaseErrors

    try:
        try:
            raise psycopg.errors.CheckViolation(f"violates check constraint; DETAIL: Failing row contains ({CANARY})")
        except psycopg.Error as error:
            raise IntegrityError(*error.args) from error
    except IntegrityError as exc:
        record = logging.LogRecord("celery.app.trace", logging.ERROR, __file__, 1,
                                   "Task %(name)s[%(id)s] %(description)s: %(exc)s",
                                   ({"name": "memories.embed_memories", "id": "t1",
                                     "description": "raised unexpected", "exc": repr(exc)},), sys.exc_info())
    assert WithholdDatabaseErrors().filter(record)
    line = SafeFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert "raised unexpected: IntegrityError" in line and "SQLSTATE 23514" in line
    _assert_clean(line)
    logging_config: dict[str, Any] = settings.LOGGING
    console = logging_config["handlers"]["console"]
    assert "withhold_database_errors" in console["filters"]
    # Plain or JSON (LOG_FORMAT), the console's formatter is one of the two that withhold them.
    assert logging_config["formatters"][console["formatter"]]["()"] in (
        "memoryhub.logsafety.SafeFormatter", "memoryhub.logsafety.SafeJsonFormatter")


def test_the_servers_log_no_statement_and_no_client_error() -> None:
    from memoryhub.embedded import EmbeddedPostgres, EmbeddedRedis

    postgres = " ".join(EmbeddedPostgres(Path("/nonexistent"), 1).process.argv)
    for setting in ("log_statement=none", "log_min_duration_statement=-1", "log_min_error_statement=panic",
                    "log_parameter_max_length_on_error=0", "log_min_messages=log", "log_error_verbosity=terse"):
        assert setting in postgres
    redis = EmbeddedRedis(Path("/nonexistent"), 1).process.argv
    assert redis[redis.index("--loglevel") + 1] == "warning"
    assert redis[redis.index("--slowlog-log-slower-than") + 1] == "-1"


# --- per-school PII categories ---------------------------------------------------------------------

def test_pii_categories_and_their_validator() -> None:
    assert PII_CATEGORIES == ("EMAIL", "PHONE", "IP_ADDRESS")
    assert redaction_categories_validated(None) is None
    assert redaction_categories_validated([]) == []
    assert redaction_categories_validated(["ip_address", "EMAIL", "email"]) == ["EMAIL", "IP_ADDRESS"]
    for bad in (["EMAIL", "SSN"], ["AWS_ACCESS_KEY"], "EMAIL", [1]):
        with pytest.raises(InvalidInput) as caught:
            redaction_categories_validated(bad)
        assert "redaction_categories" in caught.value.fields
    with pytest.raises(InvalidInput) as caught:
        redaction_categories_validated(["EMAIL", "SSN", "CREDIT_CARD"])
    message = str(caught.value.fields)
    assert "SSN" in message and "CREDIT_CARD" in message and "EMAIL" in message  # the unknown, then the choices


def test_a_school_chooses_its_pii_categories_on_every_write_path(school: School, other_school: School) -> None:
    """E-mail off (phone on): e-mail addresses stay, phones go, secrets and card numbers go whatever
    the school chose; preview says the same; another school's default (everything) is untouched."""
    school.org.redaction_categories = ["PHONE"]
    school.org.save(update_fields=["redaction_categories"])
    client, base = school.agent, f"/api/v1/stacks/{school.stack.slug}"
    created = client.post(f"{base}/memories", {"kind": "note", "content": CANARY}, format="json").json()
    batch = client.post(f"{base}/memories/batch", {"items": [{"kind": "belief", "statement": CANARY}]},
                        format="json")
    assert batch.status_code == 201, batch.content
    kernle = client.post("/sync/push", {"stack_id": school.stack.slug, "operations": [_kernle_op("k1", CANARY)]},
                         format="json")
    assert kernle.json()["synced"] == 1
    native = client.post(f"{base}/sync/push", {"operations": [_native_op("n1", CANARY)]}, format="json")
    assert native.json()["applied"] == 1
    ingested = client.post(f"{base}/ingest", {"kind": "note", "content": f"Ingested: {CANARY}"}, format="json")
    assert ingested.status_code == 201, ingested.content
    client.patch(f"{base}/memories/{created['id']}", {"content": f"Now {CANARY}"}, format="json")
    checkpoint = client.post(f"{base}/checkpoint", {"task": CANARY}, format="json")
    assert checkpoint.status_code in (200, 201)
    preview = client.post(f"{base}/redaction/preview", {"kind": "note", "content": CANARY}, format="json").json()

    texts = [*Memory.objects.filter(stack=school.stack).values_list("text", flat=True),
             Checkpoint.objects.get(stack=school.stack).task, preview["text"]]
    assert len(texts) == 7
    for text in texts:
        assert EMAIL in text and PHONE not in text and "<REDACTED:PHONE>" in text
        for secret in (AWS, KNL, CARD):
            assert secret not in text
    assert {"rule": "email", "count": 1} not in preview["redaction"]
    assert {"rule": "phone", "count": 1} in preview["redaction"]

    # No PII at all: only the secrets go.
    school.org.redaction_categories = []
    school.org.save(update_fields=["redaction_categories"])
    text = client.post(f"{base}/memories", {"kind": "note", "content": CANARY}, format="json").json()["text"]
    assert EMAIL in text and PHONE in text and AWS not in text and KNL not in text and CARD not in text
    # Isolation: the other school (default: every category) redacts everything.
    other = other_school.agent.post(f"/api/v1/stacks/{other_school.stack.slug}/memories",
                                    {"kind": "note", "content": CANARY}, format="json").json()["text"]
    for raw in (EMAIL, PHONE, AWS, KNL, CARD):
        assert raw not in other


def test_one_school_lookup_per_push_not_per_memory(school: School) -> None:
    from django.test.utils import CaptureQueriesContext

    operations = [_kernle_op(f"k{i}", f"{EMAIL} note {i}") for i in range(40)]
    with CaptureQueriesContext(connection) as queries:
        pushed = school.agent.post("/sync/push", {"stack_id": school.stack.slug, "operations": operations},
                                   format="json")
    assert pushed.json()["synced"] == 40
    organization_reads = [q for q in queries.captured_queries if 'FROM "accounts_organization"' in q["sql"]]
    assert len(organization_reads) <= 2, [q["sql"][:120] for q in organization_reads]


# --- the benchmark switch ---------------------------------------------------------------------------

@pytest.mark.parametrize(("extra", "allowed"), [
    ({"MEMORYHUB_REDACTION": "off"}, False),
    ({"MEMORYHUB_REDACTION": "off", "MEMORYHUB_BENCH": "1", "MEMORYHUB_PRODUCTION": "true", "MEMORYHUB_TEST_SUITE": "",
      "SECRET_KEY": "s" * 40, "JWT_SIGNING_KEY": "j" * 40, "API_KEY_PEPPER": "p" * 40}, False),
    ({"MEMORYHUB_REDACTION": "off", "MEMORYHUB_BENCH": "1", "SECRET_KEY": "s" * 40}, False),
    ({"MEMORYHUB_REDACTION": "off", "MEMORYHUB_BENCH": "1"}, True),
])
def test_redaction_can_be_switched_off_for_a_benchmark_only(extra: dict[str, str], allowed: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "JWT_SIGNING_KEY", "API_KEY_PEPPER",
                                                             "MEMORYHUB_PRODUCTION", "MEMORYHUB_BENCH")}
    env.update(extra, DJANGO_SETTINGS_MODULE="memoryhub.settings")
    result = subprocess.run([sys.executable, "-c", "from django.conf import settings; "
                             "print(settings.REDACTION_OFF_FOR_BENCH)"],
                            env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    if allowed:
        assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr[-500:]
    else:
        assert result.returncode != 0 and "for benchmarks only" in result.stderr
