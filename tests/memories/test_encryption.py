"""Encryption at rest of raw entries' original text (docs/privacy.md, "Encryption at rest").

A school that opts in keeps each raw entry's text as submitted, sealed with AES-256-GCM: the column
holds ciphertext only, it opens with the right key and nowhere else, a row moved onto another memory
does not open, rotation re-seals everything, and a school that did not opt in keeps nothing."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from pytest_django.fixtures import SettingsWrapper

from accounts.models import AuditEvent, Organization
from accounts.throttles import throttle_state_clear
from memories.models import Memory, RawOriginal
from memories.privacy.originals import Rotation, reseal_batch
from memoryhub.encryption import (
    DEV_KEY_ID,
    DecryptionFailed,
    EncryptionUnavailable,
    Keyring,
    keyring_from_environment,
    open_sealed,
    parse_keys,
    seal,
)
from tests.actors import School
from tests.factories import bearer_client, make_key, session_client

pytestmark = pytest.mark.django_db

K1 = "11" * 32
K2 = "2b" * 32
EMAIL = "ada.mum@example.org"
AWS = "AKIAIOSFODNN7EXAMPLE"
KNL = "knl_sk_" + "0123456789abcdef" * 2
CANARY = f"Ada's mum is {EMAIL}; she pasted {AWS} and {KNL} by mistake."
SECRETS = (EMAIL, AWS, KNL)
# What an original keeps of CANARY: the e-mail address, never a secret (docs/privacy.md "Encryption at rest").
ORIGINAL = f"Ada's mum is {EMAIL}; she pasted <REDACTED:AWS_ACCESS_KEY> and <REDACTED:KNL_API_KEY> by mistake."


@pytest.fixture(autouse=True)
def fresh_throttles() -> Iterator[None]:
    throttle_state_clear()
    yield


@pytest.fixture
def keys(settings: SettingsWrapper) -> SettingsWrapper:
    """Keys as an operator sets them: k1 current."""
    settings.ENCRYPTION_KEYRING = parse_keys(f"k1:{K1}")
    return settings


def _opt_in(school: School, keep: bool = True) -> None:
    Organization.objects.filter(pk=school.org.pk).update(keep_raw_originals=keep)


def _create_raw(school: School, content: str = CANARY, client: Any = None) -> dict[str, Any]:
    response = (client or school.agent).post(school.stack_url("memories"), {"kind": "raw", "content": content},
                                             format="json")
    assert response.status_code == 201, response.content
    return response.json()


def _original(client: Any, school: School, memory_id: str) -> Any:
    return client.get(school.stack_url(f"memories/{memory_id}/original"))


def _kernle_raw(record_id: str, content: str, when: str = "2026-11-21T23:00:00+00:00") -> dict[str, Any]:
    return {"operation": "update", "table": "raw_captures", "record_id": record_id, "local_updated_at": when,
            "data": {"id": record_id, "content": content, "source": "cli", "local_updated_at": when}}


def _assert_ciphertext(row: RawOriginal, stored_text: str) -> None:
    blob = bytes(row.ciphertext)
    for secret in (*SECRETS, CANARY, "Ada's mum", stored_text, "REDACTED"):
        assert secret.encode() not in blob, f"plaintext in the column: {secret[:6]}…"
    assert len(blob) >= 12 + 16 + len("Ada's mum")  # nonce + tag + the text's length: not truncated


# --- the envelope ---------------------------------------------------------------------------------

def test_envelope_opens_with_its_key_and_associated_data_only() -> None:
    ring = parse_keys(f"k2:{K2},k1:{K1}")
    key_id, blob = seal(b"secret text", associated_data=b"memory:1|stack:1", keyring=ring)
    assert key_id == "k2" and b"secret text" not in blob
    assert seal(b"secret text", associated_data=b"memory:1|stack:1", keyring=ring)[1][:12] != blob[:12]  # nonce
    assert open_sealed(blob, key_id="k2", associated_data=b"memory:1|stack:1", keyring=ring) == b"secret text"
    wrong_key = Keyring(current_id="k2", keys={"k2": bytes.fromhex(K1)})
    for attempt in (
        lambda: open_sealed(blob, key_id="k2", associated_data=b"memory:1|stack:1", keyring=wrong_key),
        lambda: open_sealed(blob, key_id="k2", associated_data=b"memory:2|stack:1", keyring=ring),  # moved
        lambda: open_sealed(blob[:-1] + bytes([blob[-1] ^ 1]), key_id="k2", associated_data=b"memory:1|stack:1",
                            keyring=ring),  # changed
        lambda: open_sealed(blob[:20], key_id="k2", associated_data=b"memory:1|stack:1", keyring=ring),
    ):
        with pytest.raises(DecryptionFailed, match="'k2': wrong key or tampered data"):
            attempt()
    with pytest.raises(DecryptionFailed, match="'k9' is not configured"):
        open_sealed(blob, key_id="k9", associated_data=b"memory:1|stack:1", keyring=ring)
    with pytest.raises(EncryptionUnavailable, match="MEMORYHUB_ENCRYPTION_KEYS"):
        seal(b"x", associated_data=b"", keyring=Keyring(current_id=None, keys={}))


@pytest.mark.parametrize(("value", "message"), [
    ("k1:" + "zz" * 32, "entry 1 .*64 hex"),
    ("k1:" + "ab" * 31, "entry 1 .*64 hex"),
    ("k1:" + "ab" * 33, "entry 1 .*64 hex"),
    (f"k1:{K1},k1:{K2}", "entry 2 .*'k1'.*listed twice"),
    (f"k1:{K1},,k2:{K2}", "entry 2 is empty"),
    (K1, "entry 1 has no key id"),
    (f"bad id:{K1}", "entry 1: the key id"),
    (f"dev:{K1}", "reserved for the development key"),
])
def test_key_variable_is_parsed_strictly_without_echoing_keys(value: str, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message) as raised:
        parse_keys(value)
    assert K1 not in str(raised.value) and K2 not in str(raised.value) and "zz" * 32 not in str(raised.value)


def test_development_key_only_where_allowed() -> None:
    production = keyring_from_environment({}, secret_key="s" * 50, development=False)
    assert production.current_id is None
    development = keyring_from_environment({}, secret_key="s" * 50, development=True)
    assert development.current_id == DEV_KEY_ID
    # Configured keys seal; the development key only still opens what it sealed before.
    both = keyring_from_environment({"MEMORYHUB_ENCRYPTION_KEYS": f"k1:{K1}"}, secret_key="s" * 50, development=True)
    assert both.current_id == "k1" and set(both.ids) == {"k1", DEV_KEY_ID}
    assert "11" * 8 not in repr(both)  # settings are printed: ids only


def test_a_bad_key_variable_stops_the_start() -> None:
    env = {**os.environ, "MEMORYHUB_ENCRYPTION_KEYS": "k1:not-hex", "DJANGO_SETTINGS_MODULE": "memoryhub.settings"}
    result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "MEMORYHUB_ENCRYPTION_KEYS, entry 1 (key id 'k1')" in result.stderr


# --- writes ---------------------------------------------------------------------------------------

def test_every_raw_write_path_seals_the_original_as_ciphertext(school: School, keys: SettingsWrapper) -> None:
    _opt_in(school)
    client, slug = school.agent, school.stack.slug
    created = _create_raw(school)
    assert client.post(school.stack_url("memories/batch"), {"items": [
        {"kind": "raw", "record_id": "b1", "content": f"batch: {CANARY}"},
        {"kind": "note", "content": CANARY}]}, format="json").status_code == 201
    kernle = client.post("/sync/push", {"stack_id": slug, "operations": [_kernle_raw("kr1", f"kernle: {CANARY}")]},
                         format="json")
    assert kernle.status_code == 200 and kernle.json()["synced"] == 1, kernle.content
    native = client.post(school.stack_url("sync/push"), {"operations": [
        {"op": "upsert", "kind": "raw", "record_id": "nr1", "data": {"content": f"native: {CANARY}"}}]},
        format="json")
    assert native.status_code == 200 and native.json()["applied"] == 1, native.content
    ingested = client.post(school.stack_url("ingest"), {"kind": "raw", "content": f"ingest: {CANARY}",
                                                        "force_create": True}, format="json")
    assert ingested.status_code == 201, ingested.content

    raws = {m.pk: m for m in Memory.objects.filter(stack=school.stack, kind="raw")}
    assert len(raws) == 5
    rows = list(RawOriginal.objects.filter(memory__stack=school.stack))
    assert {r.memory_id for r in rows} == set(raws)  # one per raw entry; none for the note
    for row in rows:
        assert row.key_id == "k1"
        _assert_ciphertext(row, raws[row.memory_id].text)
        body = _original(client, school, str(row.memory_id)).json()
        assert ORIGINAL in body["text"] and body["key_id"] == "k1" and AWS not in body["text"]
        assert "<REDACTED:" in raws[row.memory_id].text and EMAIL not in raws[row.memory_id].text
    assert _original(client, school, created["id"]).json()["text"].endswith(ORIGINAL)


def test_no_opt_in_or_nothing_redacted_keeps_no_original(school: School, keys: SettingsWrapper) -> None:
    not_opted = _create_raw(school)
    assert not RawOriginal.objects.exists()
    assert _original(school.agent, school, not_opted["id"]).status_code == 404
    kernle = school.agent.post("/sync/push", {"stack_id": school.stack.slug,
                                              "operations": [_kernle_raw("kr1", CANARY)]}, format="json")
    assert kernle.json()["synced"] == 1 and not RawOriginal.objects.exists()
    _opt_in(school)
    clean = _create_raw(school, "Fractions click with pizza diagrams")  # the stored text IS the original
    assert not RawOriginal.objects.exists()
    response = _original(school.agent, school, clean["id"])
    assert response.status_code == 404 and response.json()["error"]["code"] == "original_not_found"


def test_a_text_change_replaces_the_original_and_a_delete_drops_it(school: School, keys: SettingsWrapper) -> None:
    _opt_in(school)
    memory = _create_raw(school)
    url = school.stack_url(f"memories/{memory['id']}")
    assert school.agent.patch(url, {"content": f"Again: {EMAIL}"}, format="json").status_code == 200
    assert _original(school.agent, school, memory["id"]).json()["text"].startswith(f"Again: {EMAIL}")
    assert school.agent.patch(url, {"processed": True}, format="json").status_code == 200  # the text stays
    assert _original(school.agent, school, memory["id"]).json()["text"].startswith(f"Again: {EMAIL}")
    assert school.agent.patch(url, {"content": "nothing secret now"}, format="json").status_code == 200
    assert not RawOriginal.objects.filter(memory_id=memory["id"]).exists()  # the stored text is the original

    slug = school.stack.slug
    push = school.agent.post("/sync/push", {"stack_id": slug, "operations": [_kernle_raw("kr1", CANARY)]},
                             format="json")
    assert push.json()["synced"] == 1
    pushed = Memory.objects.get(stack=school.stack, record_id="kr1")
    assert RawOriginal.objects.filter(memory=pushed).exists()
    changed = _kernle_raw("kr1", f"Changed: {EMAIL}", when="2026-11-22T00:00:00+00:00")
    assert school.agent.post("/sync/push", {"stack_id": slug, "operations": [changed]},
                             format="json").json()["synced"] == 1
    assert _original(school.agent, school, str(pushed.pk)).json()["text"].startswith(f"Changed: {EMAIL}")
    deleted = {"operation": "delete", "table": "raw_captures", "record_id": "kr1",
               "local_updated_at": "2026-11-22T01:00:00+00:00"}
    assert school.agent.post("/sync/push", {"stack_id": slug, "operations": [deleted]},
                             format="json").status_code == 200
    assert not RawOriginal.objects.filter(memory=pushed).exists()


def test_an_opted_in_write_without_a_key_is_refused_and_stores_nothing(
        school: School, settings: SettingsWrapper) -> None:
    settings.ENCRYPTION_KEYRING = Keyring(current_id=None, keys={})  # production without the variable
    _opt_in(school)
    response = school.agent.post(school.stack_url("memories"), {"kind": "raw", "content": CANARY}, format="json")
    assert response.status_code == 503 and response.json()["error"]["code"] == "encryption_key_missing"
    push = school.agent.post("/sync/push", {"stack_id": school.stack.slug,
                                            "operations": [_kernle_raw("kr1", CANARY)]}, format="json")
    assert push.status_code == 503 and push.json()["error"]["code"] == "encryption_key_missing"
    assert not Memory.objects.filter(stack=school.stack).exists() and not RawOriginal.objects.exists()
    # A raw entry redaction leaves alone needs no key; nor does a school that did not opt in.
    _create_raw(school, "Fractions click with pizza diagrams")
    _opt_in(school, keep=False)
    _create_raw(school)


# --- reading it back ----------------------------------------------------------------------------------

def test_wrong_key_missing_key_or_a_swapped_row_fail_clearly(school: School, keys: SettingsWrapper) -> None:
    _opt_in(school)
    first, second = _create_raw(school), _create_raw(school, f"Second: {CANARY}")
    keys.ENCRYPTION_KEYRING = parse_keys(f"k1:{K2}")  # the same id, another key
    response = _original(school.agent, school, first["id"])
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "original_unreadable" and "wrong key or tampered data" in error["message"]
    assert "'k1'" in error["message"] and EMAIL not in response.content.decode()
    keys.ENCRYPTION_KEYRING = parse_keys(f"k2:{K2}")  # k1 dropped too early
    missing = _original(school.agent, school, first["id"]).json()["error"]
    assert missing["code"] == "original_unreadable" and "'k1' is not configured" in missing["message"]
    keys.ENCRYPTION_KEYRING = parse_keys(f"k1:{K1}")
    # A blob copied onto another memory does not open as that memory's.
    blob = RawOriginal.objects.get(memory_id=first["id"]).ciphertext
    RawOriginal.objects.filter(memory_id=second["id"]).update(ciphertext=blob)
    swapped = _original(school.agent, school, second["id"])
    assert swapped.status_code == 503 and "wrong key or tampered data" in swapped.json()["error"]["message"]
    assert _original(school.agent, school, first["id"]).status_code == 200


def test_original_endpoint_isolation_and_audit(school: School, other_school: School, keys: SettingsWrapper) -> None:
    _opt_in(school)
    memory = _create_raw(school)
    _, sibling_agent = make_key(school.org, stack=school.other_stack, user=school.admin)
    # A key bound to the stack but not issued as its agent reads as its issuer: a teacher may not
    # read originals, so neither may the key a teacher mints for the stack.
    _, teachers_key = make_key(school.org, stack=school.stack, user=school.teacher, stack_agent=False)
    denied = {
        "another school's agent": other_school.agent,
        "another school's admin": session_client(other_school.admin),
        "a teacher of the stack": session_client(school.teacher),
        "the school key": school.admin_api,
        "an agent key of another stack": bearer_client(sibling_agent),
        "a key a teacher issued for the stack": bearer_client(teachers_key),
    }
    for who, client in denied.items():
        response = _original(client, school, memory["id"])
        assert response.status_code == 404, who
        assert EMAIL not in response.content.decode(), who
    own = _original(school.agent, school, memory["id"])
    admin = _original(session_client(school.admin), school, memory["id"])
    assert own.status_code == admin.status_code == 200 and own.json()["text"] == admin.json()["text"]
    assert own["Cache-Control"] == "private, no-store"
    events = AuditEvent.objects.filter(organization=school.org, action="memory.original_read", target_id=memory["id"])
    assert events.count() == 2
    for event in events:
        assert not any(secret in str(event.metadata) for secret in SECRETS)
        assert event.metadata["key_id"] == "k1"


# --- rotation and erasure -------------------------------------------------------------------------------

def _rotate(*args: str) -> str:
    out = io.StringIO()
    call_command("rotate_encryption_key", *args, stdout=out)
    return out.getvalue()


def test_rotation_reseals_in_batches_resumably_and_the_old_key_can_go(school: School, keys: SettingsWrapper) -> None:
    _opt_in(school)
    ids = [_create_raw(school, f"{n}: {CANARY}")["id"] for n in range(5)]
    keys.ENCRYPTION_KEYRING = parse_keys(f"k2:{K2},k1:{K1}")
    before = {r.memory_id: bytes(r.ciphertext) for r in RawOriginal.objects.all()}
    assert "would re-encrypt 5 rows to key k2 (k1: 5)" in _rotate("--dry-run")
    assert set(RawOriginal.objects.values_list("key_id", flat=True)) == {"k1"}
    # An interrupted run: one batch of 2 went through; the next run does the rest.
    rotation = Rotation()
    assert reseal_batch(rotation, keyring=keys.ENCRYPTION_KEYRING, batch_size=2) == 2
    assert RawOriginal.objects.filter(key_id="k2").count() == 2
    output = _rotate("--batch-size", "2")
    assert "re-encrypting 3 rows (k1: 3) to key k2" in output
    assert "re-encrypted 2 / 3" in output and "re-encrypted 3 / 3" in output and "done: 3 rows" in output
    assert set(RawOriginal.objects.values_list("key_id", flat=True)) == {"k2"}
    assert all(bytes(r.ciphertext) != before[r.memory_id] for r in RawOriginal.objects.all())
    assert "nothing to re-encrypt" in _rotate()
    keys.ENCRYPTION_KEYRING = parse_keys(f"k2:{K2}")  # the old key removed
    for n, memory_id in enumerate(ids):
        assert _original(school.agent, school, memory_id).json()["text"].startswith(f"{n}: {ORIGINAL}")


def test_rotation_fails_clearly(school: School, keys: SettingsWrapper) -> None:
    _opt_in(school)
    _create_raw(school)
    keys.ENCRYPTION_KEYRING = Keyring(current_id=None, keys={})
    with pytest.raises(CommandError, match="MEMORYHUB_ENCRYPTION_KEYS is not set"):
        _rotate()
    keys.ENCRYPTION_KEYRING = parse_keys(f"k2:{K2}")  # k1's rows cannot be opened: reported, left alone
    with pytest.raises(CommandError, match=r"1 rows could not be opened \(k1: 1\)"):
        _rotate()
    assert RawOriginal.objects.get().key_id == "k1"


def test_erasure_removes_the_original_and_counts_it(school: School, keys: SettingsWrapper) -> None:
    _opt_in(school)
    memory, kept = _create_raw(school), _create_raw(school, f"Kept: {CANARY}")
    response = school.admin_api.post(school.stack_url(f"memories/{memory['id']}/erase"),
                                     {"requested_by": "Ada's parent, letter of 2026-11-20"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["counts"].get("raw_originals") == 1
    assert list(RawOriginal.objects.values_list("memory_id", flat=True)) == [Memory.objects.get(pk=kept["id"]).pk]
