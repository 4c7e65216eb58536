"""The index migrations swap indexes concurrently (writes are never blocked for a whole build) and
both directions leave the definitions the models declare."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from memoryhub.index_swap import index_replace_concurrently, temporary_index_name
from tests.factories import index_definitions, make_org, make_stack, other_connection, sql_value

LIVE_ONLY = ("memories_stack_kind_created", "memories_search_vector_gin", "memories_tags_gin")
TABLE_WIDE_VECTOR_INDEX = "memories_embedding_hnsw"  # live-only from 0008, dropped by 0020


def _migrate(target: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(target)


@pytest.mark.django_db(transaction=True)
def test_live_only_index_migration_runs_both_ways_and_leaves_no_temporary_index() -> None:
    from memories.services import memory_create

    stack = make_stack(make_org())
    memory_create(stack=stack, kind="note", payload={"content": "rows exist while the indexes are swapped"},
                  source="api")
    latest = [key for key in MigrationExecutor(connection).loader.graph.leaf_nodes() if key[0] == "memories"]
    try:
        _migrate([("memories", "0007_memory_toast_target")])
        before = index_definitions()
        assert all(name in before and "WHERE" not in before[name]
                   for name in (*LIVE_ONLY, TABLE_WIDE_VECTOR_INDEX)), before
        assert "memories_salience_heap_block" not in index_definitions()
    finally:
        _migrate(latest)
    after = index_definitions()
    assert all(after[name].endswith("WHERE (forgotten_at IS NULL)") for name in LIVE_ONLY), after
    assert TABLE_WIDE_VECTOR_INDEX not in after
    assert not any(name.endswith("_swap") for name in after)
    invalid = sql_value("SELECT count(*) FROM pg_index WHERE indrelid = 'memories_memory'::regclass AND NOT indisvalid")
    assert invalid == 0


@pytest.mark.django_db(transaction=True)
def test_an_index_swap_lets_writes_through_while_it_builds_and_completes_after_an_interruption() -> None:
    from memories.models import Memory
    from memories.services import memory_create

    stack = make_stack(make_org())
    name = "memories_swap_probe"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE INDEX {name} ON memories_memory (record_id)")
    blocker = other_connection(autocommit=True)
    try:
        # An open transaction that may write the table (ROW EXCLUSIVE) makes any index build wait for
        # it. A plain CREATE INDEX would queue a SHARE lock behind it and every later write behind
        # that; the concurrent swap must let writes through while it waits.
        blocker.execute("BEGIN")
        blocker.execute("LOCK TABLE memories_memory IN ROW EXCLUSIVE MODE")

        def swap() -> None:
            with other_connection(autocommit=True) as own:
                index_replace_concurrently(
                    own.cursor(), name=name,
                    create_sql=lambda tmp: f"CREATE INDEX CONCURRENTLY {tmp} ON memories_memory (record_id, kind)")

        worker = threading.Thread(target=swap)
        worker.start()
        worker.join(timeout=1.0)
        assert worker.is_alive()  # waiting for the open transaction, as a concurrent build does
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")  # a blocked write fails the test instead of hanging it
        try:
            written = memory_create(stack=stack, kind="note", payload={"content": "written during the swap"},
                                    source="api")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        assert Memory.objects.filter(pk=written.pk).exists()
        blocker.execute("COMMIT")
        worker.join(timeout=30)
        assert not worker.is_alive()
    finally:
        blocker.close()
    definitions = index_definitions()
    assert definitions[name].endswith("(record_id, kind)") and temporary_index_name(name) not in definitions

    # An interrupted earlier run left an invalid temporary index behind: the next run still completes.
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE INDEX {temporary_index_name(name)} ON memories_memory (kind)")
        cursor.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass",
                       [temporary_index_name(name)])
        index_replace_concurrently(cursor, name=name,
                                   create_sql=lambda tmp: f"CREATE INDEX CONCURRENTLY {tmp} ON memories_memory (kind)")
        definitions = index_definitions()
        cursor.execute(f"DROP INDEX {name}")
    assert definitions[name].endswith("(kind)") and temporary_index_name(name) not in definitions
