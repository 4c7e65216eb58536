"""Redaction at ingest (docs/algorithms.md §11): a canary through every write path leaves no raw
value in the stored row, its full-text vector, its revisions or its embedding input; a CRITICAL
secret through every path stores nothing and gets the right error."""

from __future__ import annotations

import io
import json
import logging
import os
import random
import subprocess
import sys
import uuid
import zipfile
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from django.db import DatabaseError, connection, transaction
from django.test import override_settings
from pytest_django.fixtures import SettingsWrapper

from accounts.models import Organization
from accounts.throttles import throttle_state_clear
from memories.changes.feed import event_dict
from memories.models import BootConfigEntry, ChangeEvent, Checkpoint, Memory, MemoryRevision, RawOriginal
from memories.privacy.originals import associated_data
from memories.privacy.redaction.engine import RedactionRefused, redact_secrets, redact_text, redact_value
from memories.privacy.redaction.folding import fold
from memories.privacy.redaction.policy import redaction_categories_validated
from memories.privacy.redaction.rules import CRITICAL as CRITICAL_RULES
from memories.privacy.redaction.rules import (
    IDENTIFIER_RULES,
    PII_CATEGORIES,
    View,
    critical_spans,
    plain_identifier,
    rule_spans,
)
from memories.search.embedding_jobs import memories_embed
from memories.search.embeddings import HashEmbedder, Vector
from memoryhub.encryption import parse_keys, seal
from memoryhub.errors import InvalidInput
from memoryhub.logsafety import SafeFormatter
from tests.actors import School
from tests.factories import bearer_client, make_key, session_client, sql_values
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
ZW = "\u200b"  # a zero-width space: invisible, and it used to split a secret past every rule


def _fullwidth(text: str) -> str:
    """`text` in fullwidth forms (U+FF01-U+FF5E), which NFKC folds back to ASCII."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)



def _pem_body(pem: str) -> str:
    return "\n".join(line for line in pem.splitlines() if line and not line.startswith("-----"))


_ED25519 = ed25519.Ed25519PrivateKey.generate().private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
_RSA = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(  # noqa: S505 (a test key)
    serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()).decode()
_OPENSSH = ed25519.Ed25519PrivateKey.generate().private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()).decode()
CRITICAL = [
    ("ssh_private_key", PRIVATE_KEY),
    ("auth_header", AUTH_HEADER),
    # Variants (the refusal must not depend on the exact header): lower case, a zero-width
    # space inside BEGIN, and a bare body with no header at all (PKCS#8, PKCS#1, OpenSSH).
    ("ssh_private_key", f"my key:\n{_ED25519.lower()}"),
    ("ssh_private_key", _RSA.replace("BEGIN", f"BE{ZW}GIN")),
    ("private_key_body", f"the key is\n{_pem_body(_ED25519)}\nkeep it safe"),
    ("private_key_body", _pem_body(_RSA)),
    ("private_key_body", f"openssh: {_pem_body(_OPENSSH)}"),
    ("auth_header", "Authorization: Token 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"),
    ("auth_header", _fullwidth("authorization") + ": bearer abc.def"),
]
# The keys above are made afresh in every process: ids that do not print them keep the test names
# the same in every pytest-xdist worker.
CRITICAL_IDS = [f"{rule}-{n}" for n, (rule, _) in enumerate(CRITICAL)]

# Variants that once got through the rules. Each is redacted; the raw value (or the part
# of it named in VARIANT_RAW) must be found nowhere.
VARIANTS = {
    "aws glued to a word": "keyAKIAJ7Q2EXAMPLEKEY42",
    "aws followed by _": "AKIAJ7Q3EXAMPLEKEY43_prod",
    "aws in fullwidth": _fullwidth("AKIAJ7Q4EXAMPLEKEY44"),
    "knl key split by a zero-width space": f"knl_sk_{ZW}fedcba9876543210fedcba98",
    "card with dots": "4111.1111.1111.1111",
    "card with slashes": "5500/0000/0000/0004",
    "non-ASCII e-mail": "jörg.müller@beispiel.de",
    "(at)/(dot) e-mail": "grace (at) example (dot) org",
    "[at] e-mail": "alan[at]example[dot]co[dot]uk",
    "e-mail split by a zero-width space": f"mary{ZW}.shelley@example.org",
    "fullwidth e-mail": _fullwidth("hopper@example.org"),
    "UK landline": "020 7946 0958",
    "UK mobile": "07911 123456",
    "DE landline": "030/90182046",
    "DE international": "+49 (0)89 12345678",
    "JWT with a short payload": "eyJhbGciOiJIUzI1NiJ9.e30.c2lnbmF0dXJlMQ",
    "JWT glued to a word": "tokeneyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiI0MiJ9.c2lnbmF0dXJlMg",
    "Bearer without digits": "Bearer AbCdEfGhIjKlMnOpQrSt",
}
VARIANT_RAW = ("J7Q2EXAMPLE", "J7Q3EXAMPLE", "J7Q4EXAMPLE", _fullwidth("EXAMPLEKEY"), "fedcba9876543210", "4111.1111",
               "5500/0000", "jörg", "müller", "grace (at)", "alan[at]", f"mary{ZW}", _fullwidth("hopper"), "7946 0958",
               "07911 123456", "90182046", "89 12345678", "e30.c2ln", "c2lnbmF0dXJlMg", "AbCdEfGhIjKl")
VARIANT_CANARY = "Notes: " + "; ".join(f"{name}: {value}" for name, value in VARIANTS.items()) + "."

# Ordinary student text the rules must leave exactly as it is.
ORDINARY = (
    "On 03.04.2024 and 03/04/2024 (2024-03-15) she scored 17/20, answered 3/4 of the questions by 09:30 "
    "and worked on fractions from 14:00-15:30. Python 3.11.4, v2.3.1 and 1.10.0; 12.5% of 200; 1/2 + 1/4 = 3/4; "
    "the score was 98-87; room 0101; ISBN 978-3-16-148410-0; the 2023/2024 school year; 09.11.1989. "
    "We met at the library at noon. Look at the dot on the map, then dot the i's. The bearer of bad news "
    "carried bearer bonds. Authorization: pending from the head teacher. Émilie a répondu à 3/4 des "
    "questions — très bien! Das Treffen ist am 12.03.2024 um 14:30 Uhr in Raum 2.014, Note 1,7. "
    "Internationalization is a long word; see https://example.com/lessons/fractions/part-two for more. "
    "Chapter 3 -- the end of private key cryptography basics. 05 06 07 08 09."
)


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


def _assert_variants_clean(text: str) -> None:
    lowered = text.lower()
    for raw in VARIANT_RAW:
        assert raw.lower() not in lowered, f"a raw value survived: {raw[:5]}…"


def test_every_variant_is_redacted_and_ordinary_text_and_unmatched_characters_stay() -> None:
    for name, value in VARIANTS.items():
        out = redact_text(f"before {value} after")
        assert "<REDACTED:" in out and out.startswith("before ") and out.endswith(" after"), name
        _assert_variants_clean(out)
    counts: Counter[str] = Counter()
    out = redact_text(VARIANT_CANARY, counts=counts)
    _assert_variants_clean(out)
    assert sum(counts.values()) == out.count("<REDACTED:") == len(VARIANTS)
    # Student prose with dates, fractions, times, scores, versions and "at"/"dot" sentences: unchanged.
    assert redact_text(ORDINARY) == ORDINARY
    # The text is folded (NFKC, invisible characters out) only to match: what did not match is
    # stored exactly as sent — accents, fullwidth letters and zero-width characters included.
    kept = f"Émilie{ZW}s {_fullwidth('ABC')} \ufb01nal"  # \ufb01: the "fi" ligature
    assert redact_text(kept) == kept
    assert redact_text(f"{kept}: {_fullwidth('ada@example.org')}, ok") == f"{kept}: <REDACTED:EMAIL>, ok"


@pytest.mark.parametrize(("rule", "secret"), CRITICAL, ids=CRITICAL_IDS)
def test_critical_variants_are_refused_and_kept_originals_lose_them(rule: str, secret: str) -> None:
    with pytest.raises(RedactionRefused) as refused:
        redact_text(f"note: {secret}")
    assert refused.value.rule == rule
    # What an original may keep (memories.privacy.originals) never holds them either: replaced, not refused.
    cleared = redact_secrets(f"note: {secret} end")
    assert "REDACTED" in cleared and "b3BlbnNz" not in cleared
    assert not any(line in cleared for line in _pem_body(secret).splitlines() if len(line) >= 40)


def test_a_public_key_or_certificate_body_is_not_a_private_key() -> None:
    public = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    rsa_public = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key().public_bytes(  # noqa: S505
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    for body in (_pem_body(public), _pem_body(rsa_public)):
        assert redact_text(body) == body


def test_no_identifier_rule_can_match_a_plain_hex_identifier() -> None:
    """refuse_sensitive_identifier lets UUID-like ids (hex digits and dashes, under 60 characters)
    through without running the rules: proven here against every rule it would run, so a rule added
    later that could match one fails this test instead of being skipped in production."""
    rng = random.Random(7)
    alphabet = "0123456789abcdefABCDEF-"
    samples = [str(uuid.uuid4()) for _ in range(200)] + [str(uuid.uuid4()).upper() for _ in range(50)]
    samples += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 59))) for _ in range(2000)]
    samples += ["4111-1111-1111-1111", "0" * 59, "f" * 59, "-" * 59, "deadbeef" * 7 + "abc"]
    for value in samples:
        assert plain_identifier(value)
        view = View(fold(value))
        assert not [c.name for c in CRITICAL_RULES if critical_spans(c, view)], value
        assert not [r.name for r in IDENTIFIER_RULES if rule_spans(r, view)], value
    assert not plain_identifier("a" * 60) and not plain_identifier("note-1") and not plain_identifier("")


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


def test_variants_and_the_forget_reason_through_every_write_path_leave_no_raw_value(school: School) -> None:
    """The VARIANTS through the write paths, and the forget reason (stored on the memory and its
    revision): found nowhere — rows, vectors, revisions, boot config, MEMORY.md, events, API, pull."""
    client, base = school.agent, f"/api/v1/stacks/{school.stack.slug}"
    created = client.post(f"{base}/memories", {"kind": "note", "content": VARIANT_CANARY,
                                               "tags": [VARIANTS["UK mobile"]]}, format="json")
    assert created.status_code == 201, created.content
    assert client.post(f"{base}/memories/batch", {"items": [{"kind": "belief", "statement": VARIANT_CANARY}]},
                       format="json").status_code == 201
    kernle = client.post("/sync/push", {"stack_id": school.stack.slug,
                                        "operations": [_kernle_op("k1", VARIANT_CANARY)]}, format="json")
    assert kernle.json()["synced"] == 1, kernle.content
    native = client.post(f"{base}/sync/push", {"operations": [_native_op("n1", VARIANT_CANARY)]}, format="json")
    assert native.json()["applied"] == 1, native.content
    ingested = client.post(f"{base}/ingest", {"kind": "note", "content": f"Ingested: {VARIANT_CANARY}"},
                           format="json")
    assert ingested.status_code == 201, ingested.content
    assert client.post(f"{base}/checkpoint", {"task": "variants", "progress": VARIANT_CANARY,
                                              "context": {"v": list(VARIANTS.values())}}, format="json").status_code \
        in (200, 201)
    assert client.put(f"{base}/boot-config/contact", {"value": VARIANT_CANARY}, format="json").status_code == 200
    # The forget reason is redacted like any text (then cut to its 64 characters, never mid-placeholder).
    for memory, reason in ((created.json()["id"], "parent asked: grace (at) example (dot) org"),
                           (ingested.json()["memory"]["id"], f"leaked {VARIANTS['aws followed by _']} + 07911 123456")):
        forgotten = client.post(f"{base}/memories/{memory}/forget", {"reason": reason}, format="json")
        assert forgotten.status_code == 200, forgotten.content
        assert "<REDACTED:" in Memory.objects.get(pk=memory).forgotten_reason
    assert MemoryRevision.objects.filter(memory__stack=school.stack, action="forget").count() == 2

    stored = _everything_stored(school.stack.pk)
    assert stored.count("<REDACTED:") > 5 * len(VARIANTS)
    _assert_variants_clean(stored)
    _assert_variants_clean(client.get(f"{base}/export/memory.md").content.decode())
    _assert_variants_clean(json.dumps([event_dict(e, school.stack.slug)
                                       for e in ChangeEvent.objects.filter(stack=school.stack)], ensure_ascii=False))
    _assert_variants_clean(client.get(f"{base}/memories?include_forgotten=true").content.decode())
    _assert_variants_clean(client.post("/sync/pull", {"stack_id": school.stack.slug, "since": None},
                                       format="json").content.decode())


@pytest.mark.parametrize("record_id", [AWS, EMAIL, KNL, "note-AKIAIOSFODNN7EXAMPLE_2",
                                       _fullwidth("knl_sk_") + "0123456789abcdefXYZ",
                                       "eyJhbGciOiJIUzI1NiJ9.e30.c2lnbmF0dXJlMQ"])
def test_a_record_id_holding_a_secret_is_refused_on_every_path(school: School, record_id: str) -> None:
    """A record id cannot be redacted (the client syncs by it): refused with 400 `sensitive_identifier`
    on create and batch, and as that operation's conflict in a push; nothing is stored."""
    client, base = school.agent, f"/api/v1/stacks/{school.stack.slug}"
    created = client.post(f"{base}/memories", {"kind": "note", "record_id": record_id, "content": "fractions"},
                          format="json")
    assert created.status_code == 400, created.content
    assert created.json()["error"]["code"] == "sensitive_identifier"
    assert list(created.json()["error"]["fields"]) == ["record_id"]
    assert record_id not in created.content.decode()
    batch = client.post(f"{base}/memories/batch", {"items": [
        {"kind": "note", "record_id": "fine-1", "content": "a"},
        {"kind": "note", "record_id": record_id, "content": "b"}]}, format="json")
    assert batch.status_code == 400 and batch.json()["error"]["code"] == "sensitive_identifier"
    assert list(batch.json()["error"]["fields"]) == ["items.1.record_id"]
    kernle = client.post("/sync/push", {"stack_id": school.stack.slug, "operations": [
        _kernle_op("fine-2", "a"), _kernle_op(record_id, "b")]}, format="json")
    assert kernle.status_code == 200 and kernle.json()["synced"] == 1
    (conflict,) = kernle.json()["conflicts"]
    assert "looks like it holds a secret" in conflict["error"]
    native = client.post(f"{base}/sync/push", {"operations": [_native_op(record_id, "c")]}, format="json")
    (result,) = native.json()["results"]
    assert result["status"] == "rejected" and result["error"]["code"] == "sensitive_identifier"
    assert sorted(Memory.objects.filter(stack=school.stack).values_list("record_id", flat=True)) == ["fine-2"]
    assert record_id not in _everything_stored(school.stack.pk)
    # A delete may still name it (one stored before ids were checked can be removed): nothing to store.
    deleted = client.post(f"{base}/sync/push", {"operations": [{"op": "delete", "kind": "note",
                                                                "record_id": record_id}]}, format="json")
    assert deleted.json()["applied"] == 1
    # Ordinary ids — UUIDs, slugs, timestamps, numbers — are accepted.
    for ordinary in (str(uuid.uuid4()), "ep-1732147200", "4111111111111111", "2024-03-15-note"):
        assert client.post(f"{base}/memories", {"kind": "note", "record_id": ordinary, "content": "x"},
                           format="json").status_code == 201, ordinary


def test_a_boot_config_key_name_holding_a_secret_is_refused(school: School) -> None:
    client, base = school.agent, f"/api/v1/stacks/{school.stack.slug}"
    for key in (AWS, KNL, "aws:AKIAIOSFODNN7EXAMPLE_x", "jwt.eyJhbGciOiJIUzI1NiJ9.e30.c2lnbmF0dXJlMQ"):
        response = client.put(f"{base}/boot-config/{key}", {"value": "x"}, format="json")
        assert response.status_code == 400, (key, response.content)
        error = response.json()["error"]
        assert error["code"] == "sensitive_identifier" and list(error["fields"]) == ["key"]
        assert key not in response.content.decode()
    assert not BootConfigEntry.objects.filter(stack=school.stack).exists()
    assert client.put(f"{base}/boot-config/tutor.style", {"value": "warm"}, format="json").status_code == 200


# --- kept originals: the school's PII, never a secret -------------------------------------------------

@pytest.mark.parametrize("categories", [None, ["PHONE"]])
def test_a_kept_original_holds_the_pii_but_no_secret(school: School, settings: SettingsWrapper,
                                                     categories: list[str] | None) -> None:
    """With raw originals kept, an AWS key, a JWT and a card number are redacted in the original too
    (they are documented as always redacted); the e-mail address the school redacts from the stored
    text is what the original keeps — read back by an admin through `/original`."""
    settings.ENCRYPTION_KEYRING = parse_keys(f"k1:{'11' * 32}")
    Organization.objects.filter(pk=school.org.pk).update(keep_raw_originals=True, redaction_categories=categories)
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI0MiJ9.c2lnbmF0dXJlMw"
    content = f"Mum: {EMAIL}. Pasted {AWS}, {jwt} and card {CARD} by mistake."
    created = school.agent.post(f"/api/v1/stacks/{school.stack.slug}/memories", {"kind": "raw", "content": content},
                                format="json")
    assert created.status_code == 201, created.content
    original = session_client(school.admin).get(
        f"/api/v1/stacks/{school.stack.slug}/memories/{created.json()['id']}/original")
    if categories is None:  # e-mail redacted in the stored text: the original keeps it, and only it
        assert original.status_code == 200, original.content
        text = original.json()["text"]
        assert EMAIL in text
        for secret in (AWS, jwt, "eyJzdWIi", CARD, "4111"):
            assert secret not in text
        assert "<REDACTED:AWS_ACCESS_KEY>" in text and "<REDACTED:JWT>" in text and "<REDACTED:CREDIT_CARD>" in text
    else:  # e-mail kept in the stored text, secrets redacted: the stored text is the original, none is kept
        assert original.status_code == 404
        assert EMAIL in created.json()["text"] and AWS not in created.json()["text"]
        assert not RawOriginal.objects.filter(memory_id=created.json()["id"]).exists()


def test_an_original_sealed_before_secrets_were_cleared_shows_none(school: School, settings: SettingsWrapper) -> None:
    """A row sealed with a secret in it (before originals were cleared of them) is cleared when read."""
    settings.ENCRYPTION_KEYRING = parse_keys(f"k1:{'11' * 32}")
    Organization.objects.filter(pk=school.org.pk).update(keep_raw_originals=True)
    created = school.agent.post(f"/api/v1/stacks/{school.stack.slug}/memories",
                                {"kind": "raw", "content": f"Mum: {EMAIL}"}, format="json").json()
    legacy = f"Mum: {EMAIL}, key {AWS}"
    key_id, blob = seal(legacy.encode(), associated_data=associated_data(created["id"], school.stack.pk))
    RawOriginal.objects.filter(memory_id=created["id"]).update(key_id=key_id, ciphertext=blob)
    text = school.agent.get(f"/api/v1/stacks/{school.stack.slug}/memories/{created['id']}/original").json()["text"]
    assert EMAIL in text and AWS not in text


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

@pytest.mark.parametrize(("rule", "secret"), CRITICAL, ids=CRITICAL_IDS)
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


@pytest.mark.parametrize(("rule", "secret"), CRITICAL, ids=CRITICAL_IDS)
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
