"""Backup and restore (manage.py backup / restore): a data dir with 3 schools and 50,000 memories,
restored into an empty one, has every count, every embedding and the same search results."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from memories.models import Memory
from memoryhub.backup import MANIFEST_NAME
from memoryhub.database import database_conninfo
from memoryhub.embedded import EmbeddedPostgres, free_port
from tests.factories import make_org, make_stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # slow: pg_dump and a second PostgreSQL

MEMORIES = 50_000
T0 = datetime(2026, 11, 1, tzinfo=UTC)
TOPICS = ("fractions", "photosynthesis", "the French revolution", "volcanoes", "poetry", "algebra")


def seed() -> None:
    """3 schools, 2 stacks each, 50,000 memories with vectors, set-based: one template row per stack
    written by the ORM, copied by one INSERT … SELECT (the write kernel's own paths are tested
    elsewhere; here the bytes matter)."""
    stacks = [make_stack(make_org(f"School {s}"), f"student-{s}-{n}") for s in range(3) for n in range(2)]
    Memory.objects.bulk_create([Memory(stack=stack, kind="note", record_id="template", text="template",
                                       created_at=T0, server_updated_at=T0, size_bytes=40) for stack in stacks])
    with connection.cursor() as cursor:
        cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'memories_memory' "
                       "AND is_generated = 'NEVER' AND column_name NOT IN ('id', 'record_id', 'text', 'stack_id', "
                       "'change_seq')")
        columns = ", ".join(f"t.{name}" for (name,) in cursor.fetchall())
        cursor.execute(
            f"INSERT INTO memories_memory (id, record_id, text, stack_id, {columns.replace('t.', '')}) "  # noqa: S608
            f"SELECT gen_random_uuid(), 'r-' || g, 'Note ' || g || ' about ' || (%s::text[])[1 + g %% %s] "
            f"|| ' and practice ' || (g %% 97), t.stack_id, {columns} "
            "FROM generate_series(0, %s) g JOIN memories_memory t "
            "ON t.record_id = 'template' AND t.stack_id = (%s::int[])[1 + g %% %s]",
            [list(TOPICS), len(TOPICS), MEMORIES - 1, [stack.pk for stack in stacks], len(stacks)])
        cursor.execute("DELETE FROM memories_memory WHERE record_id = 'template'")
        # A deterministic 384-d vector per row, computed in place (no stack here is large enough for
        # a vector index of its own, docs/algorithms.md §7.3).
        cursor.execute("""
            UPDATE memories_memory m
               SET embedding = (SELECT array_agg(sin(ord * (1 + (abs(hashtext(m.id::text)) % 1000))))
                                  FROM generate_series(1, 384) ord)::vector,
                   embedding_model = 'hash-v1/384', embedded_version = m.version""")


FINGERPRINT_SQL = {
    "memories": ("SELECT count(*), md5(string_agg(id::text || text || change_seq, ',' ORDER BY id)) "
                 "FROM memories_memory"),
    "embeddings": "SELECT count(embedding), md5(string_agg(embedding::text, ',' ORDER BY id)) FROM memories_memory",
    "stacks": "SELECT count(*), md5(string_agg(slug || memory_count || bytes_used, ',' ORDER BY id)) FROM stacks_stack",
    "schools": "SELECT count(*), md5(string_agg(slug, ',' ORDER BY id)) FROM accounts_organization",
    "revisions": "SELECT count(*) FROM memories_memoryrevision",
    # A search: exact nearest neighbours of one stored vector, and the full-text leg's top hits.
    "vector search": """SET enable_indexscan = off; SELECT string_agg(id::text, ',') FROM (
        SELECT id FROM memories_memory ORDER BY embedding <=> (SELECT embedding FROM memories_memory
        WHERE record_id = 'r-12345') , id LIMIT 10) t""",
    "keyword search": """SELECT string_agg(id::text, ',') FROM (SELECT id FROM memories_memory
        WHERE search_vector @@ plainto_tsquery('english', 'volcanoes practice')
        ORDER BY ts_rank_cd(search_vector, plainto_tsquery('english', 'volcanoes practice')) DESC, id LIMIT 10) t""",
}


def fingerprint(conninfo: str) -> dict[str, Any]:
    result = {}
    with psycopg.connect(conninfo) as conn:
        for name, sql in FINGERPRINT_SQL.items():
            *setup, query = [part for part in sql.split(";") if part.strip()]
            for statement in setup:
                conn.execute(statement)
            result[name] = conn.execute(query).fetchone()
            conn.execute("RESET ALL")
    return result


@pytest.fixture
def restored_server() -> Iterator[list[EmbeddedPostgres]]:
    started: list[EmbeddedPostgres] = []
    yield started
    for server in started:
        server.stop()


@pytest.mark.long
def test_a_backup_restores_into_an_empty_data_dir_with_everything_equal(
        tmp_path: Path, settings: Any, restored_server: list[EmbeddedPostgres], capsys: Any) -> None:
    seed()
    source_dir = tmp_path / "source"
    source_dir.mkdir()
    (source_dir / "secrets.json").write_text(json.dumps({"SECRET_KEY": "s" * 50}))
    settings.DATA_DIR = source_dir
    before = fingerprint(database_conninfo())
    assert before["memories"][0] == MEMORIES and before["embeddings"][0] == MEMORIES

    call_command("backup", str(tmp_path / "backup"))
    manifest = json.loads((tmp_path / "backup" / MANIFEST_NAME).read_text())
    assert manifest["counts"]["memories_memory"] == MEMORIES and "files/secrets.json" in manifest["files"]
    assert "dumped" in capsys.readouterr().out  # progress, table by table

    target = tmp_path / "restored"
    call_command("restore", str(tmp_path / "backup"), "--data-dir", str(target))
    assert (target / "secrets.json").read_text() == (source_dir / "secrets.json").read_text()
    server = EmbeddedPostgres(target / "postgres", free_port(), log_path=tmp_path / "restored.log")
    server.prepare()
    server.start()
    restored_server.append(server)
    assert fingerprint(server.url("memoryhub")) == before


def test_restore_refuses_a_damaged_backup_or_a_data_dir_in_use(tmp_path: Path, settings: Any) -> None:
    settings.DATA_DIR = tmp_path / "data"
    make_stack(make_org())
    call_command("backup", str(tmp_path / "backup"))
    with pytest.raises(CommandError, match="not empty"):
        call_command("backup", str(tmp_path / "backup"))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "something").write_text("x")
    with pytest.raises(CommandError, match="not empty"):
        call_command("restore", str(tmp_path / "backup"), "--data-dir", str(busy))
    with (tmp_path / "backup" / "database.dump").open("ab") as dump:
        dump.write(b"tampered")
    with pytest.raises(CommandError, match="damaged"):
        call_command("restore", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "new"))
    assert not (tmp_path / "new").exists()
