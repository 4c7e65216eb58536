"""The stack archive (for access requests; docs/privacy.md "Export (access requests)"): every kind and
every field, streamed with bounded memory, audited, isolated per school, and re-importable into an
empty stack with equal content."""

from __future__ import annotations

import io
import json
import tracemalloc
import zipfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import F
from django.http import StreamingHttpResponse
from django.utils import timezone

from accounts.models import AuditEvent
from memories.governance.archive import ARCHIVE_FORMAT_VERSION, MEMORY_FIELDS, archive_chunks
from memories.models import Memory, MemoryKind
from memories.services import CheckpointInput, boot_config_set, checkpoint_save, memory_forget, memory_update
from stacks.models import Stack
from tests.actors import School

pytestmark = pytest.mark.django_db

SAMPLES: dict[str, dict[str, Any]] = {
    "raw": {"content": "Student asked about fractions during lunch"},
    "episode": {"objective": "Practise fractions", "outcome": "Solved 8 of 10", "outcome_type": "partial",
                "lessons": ["Draw the pie first"]},
    "note": {"content": "Prefers visual explanations", "note_type": "insight"},
    "belief": {"statement": "Fractions are easier with pictures", "confidence": 0.9},
    "value": {"name": "curiosity", "statement": "Ask why before how", "priority": 80},
    "goal": {"title": "Master fractions", "priority": "high", "status": "active"},
    "drive": {"drive_type": "curiosity", "intensity": 0.7, "focus_areas": ["math"]},
    "relationship": {"entity_name": "Ms. Rivera", "entity_type": "person", "relationship_type": "teacher",
                     "interaction_count": 12},
    "playbook": {"name": "Fraction warm-up", "description": "Start every session", "steps": [{"action": "pie"}]},
}
# What must survive the round trip, per memory (ids, versions and change numbers are new).
CONTENT = ("kind", "record_id", "text", "data", "extra", "tags", "confidence", "source_type", "source_entity",
           "derived_from", "source_episodes", "emotional_valence", "emotional_arousal", "emotional_tags",
           "subject_ids", "access_grants", "consent_grants", "strength", "times_accessed", "last_accessed",
           "is_protected", "expires_at", "client_version", "client_updated_at", "created_at", "size_bytes",
           "forgotten_reason")


def _populate(school: School) -> None:
    """Every kind through the native sync push, with provenance, privacy fields, unknown fields,
    a server forget, a client forget, a soft delete, a revision, checkpoints and boot config."""
    operations = []
    for kind, sample in SAMPLES.items():
        for n in range(2):
            operations.append({"op": "upsert", "kind": kind, "record_id": f"{kind}-{n}", "data": {
                **sample, "tags": ["math", kind], "source_type": "observation", "source_entity": "tutor:1",
                "derived_from": [f"raw:raw-{n}"], "subject_ids": ["human:ada"], "access_grants": ["role:teacher"],
                "consent_grants": ["org:hill"], "emotional_valence": 0.25, "my_own_field": {"n": n},
                "created_at": f"2026-01-0{n + 1}T10:00:00+00:00", "local_updated_at": "2026-02-01T00:00:00Z",
                "expires_at": "2030-01-01T00:00:00+00:00" if n else None,
            }})
    operations.append({"op": "upsert", "kind": "note", "record_id": "client-forgot",
                       "data": {"content": "Dropped by the device", "strength": 0.0}})
    operations.append({"op": "upsert", "kind": "note", "record_id": "deleted",
                       "data": {"content": "Deleted on the device", "deleted": True}})
    response = school.agent.post(school.stack_url("sync/push"), {"operations": operations}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["rejected"] == 0, [r for r in response.json()["results"] if r["status"] != "applied"]
    memory_forget(memory=Memory.objects.get(stack=school.stack, record_id="belief-1"), reason="teacher request")
    memory_update(memory=Memory.objects.get(stack=school.stack, record_id="note-0"),
                  payload={"content": "Prefers visual explanations, and pizza"}, source="test")
    checkpoint_save(stack=school.stack, checkpoint=CheckpointInput(task="Fractions unit", progress="half",
                                                                   context={"page": 4}))
    checkpoint_save(stack=school.stack, checkpoint=CheckpointInput(
        task="Decimals unit", next_step="quiz", pending=["Mark the quiz"], episode_record_id="cp-1",
        saved_at=timezone.now().replace(microsecond=0) - timedelta(hours=1)))  # JSON keeps milliseconds
    boot_config_set(stack=school.stack, key="student", value="Ada")


def _export(client: Any, url: str) -> tuple[StreamingHttpResponse, zipfile.ZipFile]:
    response = client.get(url)
    assert response.status_code == 200, getattr(response, "content", b"")[:500]
    return response, zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content)))


def _lines(archive: zipfile.ZipFile, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in archive.read(name).decode().splitlines() if line.strip()]


def _as_json(value: Any) -> Any:
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def _to_milliseconds(value: Any) -> Any:
    return value.replace(microsecond=value.microsecond // 1000 * 1000) if isinstance(value, datetime) else value


def _content(stack: Stack) -> dict[tuple[str, str], dict[str, Any]]:
    """The stack's memories at the archive's precision: its JSON keeps a time to the millisecond, so
    a time 412 µs past a second comes back as the second itself."""
    rows = Memory.objects.filter(stack=stack).values(*CONTENT, "forgotten_at", "deleted_at")
    result = {}
    for row in rows:
        row = _as_json({name: _to_milliseconds(value) for name, value in row.items()})
        row["forgotten"] = row.pop("forgotten_at") is not None
        row["deleted"] = row.pop("deleted_at") is not None
        result[(row["kind"], row["record_id"])] = row
    return result


def test_archive_has_every_kind_and_matches_the_database_field_for_field(school: School) -> None:
    _populate(school)
    response, archive = _export(school.agent, school.stack_url("export/archive"))
    assert isinstance(response, StreamingHttpResponse)
    assert response["Content-Type"] == "application/zip"
    assert "attachment" in response["Content-Disposition"]
    names = set(archive.namelist())
    assert {"README.md", "manifest.json", "MEMORY.md", "revisions.jsonl", "checkpoints.jsonl",
            "boot_config.jsonl"} <= names
    assert {f"memories/{kind}.jsonl" for kind in MemoryKind.values} <= names
    manifest = json.loads(archive.read("manifest.json"))
    assert manifest["format_version"] == ARCHIVE_FORMAT_VERSION
    assert manifest["stack"]["slug"] == school.stack.slug
    assert "format version 1" in archive.read("README.md").decode()

    exported = {}
    for kind in MemoryKind.values:
        for line in _lines(archive, f"memories/{kind}.jsonl"):
            assert line["kind"] == kind
            exported[line["id"]] = line
    stored = {str(row["id"]): _as_json(row) for row in Memory.objects.filter(stack=school.stack).values(*MEMORY_FIELDS)}
    assert exported == stored  # every memory, every column, every value
    assert len(stored) == 2 * len(SAMPLES) + 2
    assert set(MEMORY_FIELDS) >= {"version", "created_at", "server_updated_at", "source_type", "derived_from",
                                  "subject_ids", "access_grants", "consent_grants", "forgotten_at",
                                  "forgotten_reason", "deleted_at", "extra"}
    forgotten = next(m for m in exported.values() if m["record_id"] == "belief-1")
    assert forgotten["forgotten_reason"] == "teacher request" and forgotten["forgotten_at"]

    revisions = _lines(archive, "revisions.jsonl")
    assert revisions and {r["memory_id"] for r in revisions} <= set(stored)
    assert [c["task"] for c in _lines(archive, "checkpoints.jsonl")] == ["Fractions unit", "Decimals unit"]
    assert _lines(archive, "boot_config.jsonl")[0]["key"] == "student"
    assert "## Boot Config" in archive.read("MEMORY.md").decode()
    assert manifest["counts"]["memories/note.jsonl"] == len(_lines(archive, "memories/note.jsonl"))


def test_archive_reimports_into_an_empty_stack_with_equal_content(school: School, tmp_path: Path) -> None:
    _populate(school)
    # The stack's own key: it sees every memory whatever its privacy grants (a school key would get
    # only what the grants admit it to, docs/privacy.md "Privacy grants"), so the round trip is complete.
    _, archive = _export(school.agent, school.stack_url("export/archive"))
    path = tmp_path / "ada.zip"
    with archive.fp as fp:  # type: ignore[union-attr]
        fp.seek(0)
        path.write_bytes(fp.read())
    out, err = io.StringIO(), io.StringIO()
    call_command("import_archive", str(path), "--school", school.org.slug, "--stack", "ada-restored",
                 stdout=out, stderr=err)
    assert "0 rejected" in out.getvalue()
    assert "importing" in err.getvalue()  # the progress bar
    restored = Stack.objects.get(organization=school.org, slug="ada-restored")
    assert _content(restored) == _content(school.stack)
    # The counters and the checkpoint/boot config came along through the services.
    original = Stack.objects.get(pk=school.stack.pk)
    assert (restored.memory_count, restored.bytes_used) == (original.memory_count, original.bytes_used)
    checkpoint_fields = ("task", "progress", "next_step", "context", "pending", "saved_at", "episode_record_id")
    assert list(restored.checkpoints.order_by("created_at").values_list(*checkpoint_fields)) \
        == list(original.checkpoints.order_by("created_at").values_list(*checkpoint_fields))
    assert dict(restored.boot_config.values_list("key", "value")) == {"student": "Ada"}
    # Into a stack that already holds memories: refused, nothing added.
    before = Memory.objects.filter(stack=restored).count()
    with pytest.raises(Exception, match="not empty"):
        call_command("import_archive", str(path), "--school", school.org.slug, "--stack", "ada-restored",
                     stdout=io.StringIO(), stderr=io.StringIO())
    assert Memory.objects.filter(stack=restored).count() == before


def test_import_refuses_a_file_that_is_not_an_archive(school: School, tmp_path: Path) -> None:
    path = tmp_path / "junk.zip"
    path.write_bytes(b"not a zip")
    with pytest.raises(Exception, match="Not a MemoryHub stack archive"):
        call_command("import_archive", str(path), "--school", school.org.slug, "--stack", "x",
                     stdout=io.StringIO(), stderr=io.StringIO())
    assert not Stack.objects.filter(slug="x").exists()


def test_export_is_audited_without_memory_content(school: School) -> None:
    _populate(school)
    _export(school.agent, school.stack_url("export/archive"))
    event = AuditEvent.objects.get(organization=school.org, action="stack.exported")
    assert event.target_id == school.stack.slug and event.actor_key_id == school.agent_key.pk
    assert "fractions" not in json.dumps(event.metadata).lower()


def test_other_school_and_other_stack_keys_get_404(school: School, other_school: School) -> None:
    _populate(school)
    assert other_school.admin_api.get(school.stack_url("export/archive")).status_code == 404
    assert other_school.agent.get(school.stack_url("export/archive")).status_code == 404
    # The agent key of alice cannot export bob, its sibling.
    assert school.agent.get(f"/api/v1/stacks/{school.other_stack.slug}/export/archive").status_code == 404
    assert not AuditEvent.objects.filter(action="stack.exported").exists()


def _peak_while_exporting(stack: Stack) -> tuple[int, int]:
    """(peak traced Python memory while the archive streams, uncompressed bytes of its entries)."""
    tracemalloc.start()
    try:
        for chunk in archive_chunks(stack=stack):
            del chunk  # a response hands each chunk on; nothing keeps it
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    data = b"".join(archive_chunks(stack=stack))
    return peak, sum(info.file_size for info in zipfile.ZipFile(io.BytesIO(data)).infolist())


def _add_notes(stack: Stack, start: int, count: int) -> None:
    now = timezone.now()
    filler = "x" * 600
    Memory.objects.bulk_create([
        Memory(stack=stack, kind="note", record_id=f"n{i}", text=f"note {i} {filler}",
               data={"content": f"note {i} {filler}"}, created_at=now - timedelta(seconds=i),
               server_updated_at=now, size_bytes=700)
        for i in range(start, start + count)
    ], batch_size=1_000)
    Stack.objects.filter(pk=stack.pk).update(memory_count=F("memory_count") + count)


@pytest.mark.slow
def test_a_5000_memory_export_streams_with_bounded_memory(school: School) -> None:
    _add_notes(school.stack, 0, 1_000)
    peak_1000, uncompressed_1000 = _peak_while_exporting(school.stack)
    _add_notes(school.stack, 1_000, 4_000)
    peak_5000, uncompressed = _peak_while_exporting(school.stack)
    assert uncompressed > 5_000 * 1_500  # ~10 MB of JSON lines went through
    # Five times the rows, about the same peak: memory follows the row chunk, not the stack.
    assert peak_5000 < peak_1000 * 1.5 + 512 * 1024, (peak_1000, peak_5000)
    # The ~8 MB more that went through left (almost) nothing behind: far less than a tenth of it.
    assert peak_5000 - peak_1000 < (uncompressed - uncompressed_1000) / 10, (peak_1000, peak_5000, uncompressed)
