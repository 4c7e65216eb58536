"""The decay pass against the rest of the system: the live-only indexes search reads through, the
stacks' change locks its tombstones take, and its batches on several connections at once."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from memories.lifecycle.decay_pass import decay_pass
from memories.models import JobRun, Memory, MemoryRevision, MemorySalience
from memories.search.embedding_jobs import memories_embed
from memories.search.embeddings import get_embedder
from memories.search.hybrid import search_memories
from memories.search.query import SearchQuery
from memories.search.vector_indexes import stack_index_name, stack_vector_index_ensure
from memories.search.vector_leg import vector_sql
from memories.services import memory_create, memory_recover
from stacks.models import Stack
from tests.factories import index_definitions, make_org, make_stack, other_connection, sql_rows, sql_values

NOW = timezone.now().replace(microsecond=0)
_ids = itertools.count(1)
BTREE_OF_LIVE_ROWS = ("memories_stack_kind_created",)
# Any partial index of live rows can stand in for "every live row" on a small table: a fresh-state run
# of tests/memories once walked the tags GIN (no tags in the query) instead of the one under test.
OTHERS_OF_LIVE_ROWS = (*BTREE_OF_LIVE_ROWS, "memories_tags_gin")
LIVE_ONLY_INDEXES = ("memories_stack_kind_created", "memories_search_vector_gin", "memories_tags_gin")


def note(stack: Stack, content: str, *, days_old: float = 0.0) -> Memory:
    """A note with its embedding, written through the service, created `days_old` days ago."""
    memory = memory_create(stack=stack, kind="note", payload={"content": content, "tags": ["biology"]}, source="api")
    memories_embed(ids=[memory.pk])
    created = NOW - timedelta(days=days_old)
    Memory.objects.filter(pk=memory.pk).update(created_at=created)
    return Memory.objects.get(pk=memory.pk)


def found(stack: Stack, text: str) -> list[Any]:
    result = search_memories(stack_ids=[stack.pk], query=SearchQuery(text=text, min_similarity=0.0))
    return [hit.memory.pk for hit in result.hits]


def plan_and_rows(sql: str, params: Any, *, without: tuple[str, ...], sort: bool = True) -> tuple[str, list[Any]]:
    """EXPLAIN and result of `sql` with sequential scans off (plain index scans too, for `sort`) and
    the indexes `without` dropped for this one statement (a savepoint, rolled back): the tables
    here are tiny, so the planner would rather read them whole or walk another index of live rows
    than the one under test."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # pending deferred FK checks would block DROP INDEX
        for index in without:
            cursor.execute(f"DROP INDEX {index}")
        cursor.execute("SET LOCAL enable_seqscan = off")
        if sort:
            # A text match is a bitmap scan of the GIN; with statistics of a tiny table (another test
            # may have run ANALYZE) the planner would rather walk the primary key in id order.
            cursor.execute("SET LOCAL enable_indexscan = off")
        else:  # ORDER BY distance: only a vector index can produce the order
            cursor.execute("SET LOCAL enable_sort = off")
        plan = "\n".join(sql_values("EXPLAIN " + sql, params))
        rows = [row.id for row in sql_rows(sql, params)]
        transaction.set_rollback(True)
    return plan, rows


_KEYWORD_SQL = ("SELECT id FROM memories_memory WHERE stack_id + 0 = %s AND forgotten_at IS NULL "
                "AND search_vector @@ plainto_tsquery('english', %s) ORDER BY id")


@pytest.mark.django_db
def test_a_tombstone_leaves_the_live_only_indexes_and_recover_puts_it_back():
    stack = make_stack(make_org())
    faded = note(stack, "chloroplasts turn sunlight into sugar", days_old=400)
    fresh = note(stack, "chloroplasts are green", days_old=1)
    definitions = {name: d for name, d in index_definitions().items() if name in LIVE_ONLY_INDEXES}
    assert set(definitions) == set(LIVE_ONLY_INDEXES)
    assert all(d.endswith("WHERE (forgotten_at IS NULL)") for d in definitions.values()), definitions
    assert set(found(stack, "chloroplasts")) == {faded.pk, fresh.pk}

    run = decay_pass(now=NOW)

    assert run.counts["forgotten"] == 1
    assert Memory.objects.get(pk=faded.pk).forgotten_reason == "salience_decay"
    # Search and the index path leave the tombstone out; the query still walks the partial GIN.
    assert found(stack, "chloroplasts") == [fresh.pk]
    plan, rows = plan_and_rows(_KEYWORD_SQL, [stack.pk, "chloroplasts"], without=OTHERS_OF_LIVE_ROWS)
    assert "memories_search_vector_gin" in plan and rows == [fresh.pk]

    memory_recover(memory=Memory.objects.get(pk=faded.pk))

    assert set(found(stack, "chloroplasts")) == {faded.pk, fresh.pk}
    plan, rows = plan_and_rows(_KEYWORD_SQL, [stack.pk, "chloroplasts"], without=OTHERS_OF_LIVE_ROWS)
    assert "memories_search_vector_gin" in plan and rows == sorted([faded.pk, fresh.pk])


@pytest.mark.django_db
def test_search_still_walks_the_live_only_vector_index_after_a_tombstone():
    stack = make_stack(make_org())
    faded = note(stack, "mitochondria make energy", days_old=400)
    fresh = note(stack, "mitochondria have their own DNA", days_old=1)
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # deferred FK checks would block CREATE INDEX
    stack_vector_index_ensure(stack_id=stack.pk, concurrently=False)
    own_index = index_definitions()[stack_index_name(stack.pk)]
    assert own_index.endswith(f"WHERE ((stack_id = {stack.pk}) AND (forgotten_at IS NULL))")
    decay_pass(now=NOW)
    assert Memory.objects.get(pk=faded.pk).forgotten_at is not None

    vector = get_embedder().embed(["mitochondria"])[0]
    sql, params = vector_sql(SearchQuery(text="mitochondria"), [stack.pk], vector, 10, exact=False,
                                     single_stack=True)
    plan, rows = plan_and_rows(sql, params, without=(), sort=False)
    assert stack_index_name(stack.pk) in plan
    assert rows == [fresh.pk]  # the stack's own graph holds live rows only


def _old(stack: Stack, days_old: float = 400, *, padding: int = 0) -> Memory:
    created = NOW - timedelta(days=days_old)
    n = next(_ids)
    return Memory.objects.create(stack=stack, kind="episode", record_id=f"pass-{n}",
                                 text=f"memory {n} " + "x" * padding, created_at=created, server_updated_at=created)


@pytest.mark.django_db(transaction=True)
def test_a_tombstone_waits_for_its_stacks_change_lock():
    """While a writer holds a stack's change lock (a push in progress) the pass does not stamp a
    change_seq in that stack: a cursor reader can never see a later sequence commit first."""
    stack = make_stack(make_org())
    faded = _old(stack)
    writer = other_connection()
    try:
        writer.execute("SELECT id FROM stacks_stack WHERE id = %s FOR NO KEY UPDATE", [stack.pk])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '300ms'")
        try:
            with pytest.raises(OperationalError):
                decay_pass(now=NOW, workers=1)
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        assert Memory.objects.get(pk=faded.pk).forgotten_at is None
        assert JobRun.objects.get(name="decay").status == JobRun.Status.FAILED
    finally:
        writer.rollback()
        writer.close()

    run = decay_pass(now=NOW, workers=1)  # the push committed: the lock is free again

    assert run.counts["forgotten"] == 1
    assert Memory.objects.get(pk=faded.pk).forgotten_at == NOW


@pytest.mark.django_db(transaction=True)
def test_batches_on_several_connections_give_the_same_result_as_one():
    org = make_org()
    stacks = [make_stack(org) for _ in range(3)]
    # ~1.5 kB rows (kept in line): a few per heap page, so the pass has several page ranges to share.
    memories = [_old(stack, days_old=days, padding=1500) for stack in stacks for days in (1, 30, 200, 400, 900)]
    protected = _old(stacks[0], days_old=900, padding=1500)
    Memory.objects.filter(pk=protected.pk).update(is_protected=True)
    # The pass sizes its page ranges from the planner's rows-per-page; statistics an earlier test left
    # (many pages, few live rows) made it put two or three pages in a batch, and the three workers
    # then shared two ranges. Analysed, this table's ~2.7 rows a page give one page per batch.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memories_memory")

    run = decay_pass(now=NOW, batch_size=1, workers=3)  # one heap page per batch

    assert run.status == JobRun.Status.SUCCEEDED
    assert run.counts["workers"] == 3 and run.counts["batches"] >= 1
    assert run.counts["scanned"] == run.counts["updated"] == 16
    forgotten = set(Memory.objects.filter(forgotten_reason="salience_decay").values_list("pk", flat=True))
    # 200, 400 and 900 days untouched: forgotten in every stack; a protected one never.
    assert forgotten == {m.pk for m in memories if (NOW - m.created_at).days >= 200}
    assert run.counts["forgotten"] == len(forgotten) == 9
    assert MemoryRevision.objects.filter(action="forget", source="decay").count() == 9
    saliences = MemorySalience.objects.filter(memory_id__in=[m.pk for m in [*memories, protected]])
    assert saliences.count() == 16
    # A second pass at the same time changes nothing, wherever its batches run.
    again = decay_pass(now=NOW, batch_size=1, workers=2)
    assert (again.counts["updated"], again.counts["forgotten"]) == (0, 0)
    assert connection.connection is not None  # the caller's own connection is untouched


@pytest.mark.django_db
def test_a_stale_page_hint_only_costs_a_rewrite():
    """`MemorySalience.heap_block` is where the pass looks for a row's stored salience; a row that
    moved (or a salience stored by a review, without a page) is simply written again, correctly."""
    stack = make_stack(make_org())
    moved, reviewed, settled = _old(stack, days_old=10), _old(stack, days_old=10), _old(stack, days_old=10)
    decay_pass(now=NOW)
    pages = {row.id: row.page for row in sql_rows(
        "SELECT m.id, (m.ctid::text::point)[0]::integer AS page FROM memories_memory m WHERE m.stack_id = %s",
        [stack.pk])}
    assert MemorySalience.objects.get(memory_id=settled.pk).heap_block == pages[settled.pk]
    MemorySalience.objects.filter(memory_id=moved.pk).update(heap_block=2_000_000_000)  # as if it had moved
    MemorySalience.objects.filter(memory_id=reviewed.pk).update(heap_block=None)
    later = NOW + timedelta(hours=1)  # salience has barely moved: only the two lost rows are written

    run = decay_pass(now=later)

    assert run.counts["updated"] == 2
    rows = MemorySalience.objects.filter(memory_id__in=[moved.pk, reviewed.pk, settled.pk])
    assert {row.memory_id: row.heap_block for row in rows} == pages
    assert {row.memory_id: row.computed_at for row in rows} == {moved.pk: later, reviewed.pk: later, settled.pk: NOW}
    # Forgetting is decided on the recomputed salience either way.
    MemorySalience.objects.filter(memory_id=moved.pk).update(heap_block=2_000_000_000)
    assert decay_pass(now=NOW + timedelta(days=400)).counts["forgotten"] == 3
