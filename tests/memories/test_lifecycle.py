"""The decay pass, forgetting candidates, explicit reviews and job runs, on a virtual clock.

`now` is passed into every service; memories are dated relative to the real clock only where a
service stamps wall-clock time itself (revision rows of `memory_recover`).
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.utils import timezone

from memories.lifecycle.decay import (
    DecayState,
    Grade,
    next_difficulty,
    retrievability,
    salience,
    salience_sql,
    stability_after_recall,
)
from memories.lifecycle.decay_pass import DECAY_BATCH_SIZE, _batch_ranges, decay_pass, forgetting_candidates
from memories.lifecycle.jobs import JOB_LOCK_NAMESPACE, run_job
from memories.lifecycle.reviews import record_review
from memories.lifecycle.ttl import ttl_purge
from memories.models import JobRun, Memory, MemoryRevision, MemorySalience
from memories.selectors import memories_list
from memories.services import memory_forget, memory_recover
from memoryhub.errors import Conflict, NotFound
from stacks.models import Stack
from tests.factories import make_org, make_stack, other_connection, sql_rows

pytestmark = pytest.mark.django_db

NOW = timezone.now().replace(microsecond=0)
_ids = itertools.count(1)


def make_memory(stack: Stack, kind: str = "episode", *, days_old: float = 0.0, **fields: Any) -> Memory:
    created = NOW - timedelta(days=days_old)
    n = next(_ids)
    return Memory.objects.create(
        stack=stack, kind=kind, record_id=f"rec-{n}", text=f"memory {n}", created_at=created,
        server_updated_at=created, **fields,
    )


def reload(memory: Memory) -> Memory:
    return Memory.objects.get(pk=memory.pk)


def stored(memory: Memory) -> float | None:
    """The salience the pass stored for `memory` (the side table), None if never computed."""
    return MemorySalience.objects.filter(memory_id=memory.pk).values_list("salience", flat=True).first()


def decay_state() -> dict:
    """{memory id: (stored salience, forgotten_at, version)} of every memory."""
    saliences = dict(MemorySalience.objects.values_list("memory_id", "salience"))
    return {m.pk: (saliences.get(m.pk), m.forgotten_at, m.version) for m in Memory.objects.all()}


def default_batches() -> int:
    """Batches a default-size pass runs over the table as it is now: one on a freshly made table,
    more when earlier tests' rolled-back rows left it large and sparse (the page count and the
    statistics survive their rollback), so the figure comes from the pass's own page ranges."""
    return len(_batch_ranges(batch_size=DECAY_BATCH_SIZE))


@pytest.fixture
def stack() -> Stack:
    return make_stack(make_org())


def test_untouched_memory_fades_and_is_tombstoned_while_protected_values_and_fresh_ones_stay(stack):
    old = make_memory(stack, days_old=200)
    fresh = make_memory(stack, days_old=1)
    protected = make_memory(stack, days_old=200, is_protected=True)
    value = make_memory(stack, "value", days_old=2000)
    drive = make_memory(stack, "drive", days_old=2000)
    seq_before = old.change_seq

    batches = default_batches()
    run = decay_pass(now=NOW)

    old = reload(old)
    assert old.forgotten_at == NOW
    assert old.forgotten_reason == "salience_decay"
    assert old.version == 2
    assert old.change_seq > seq_before  # pull sees the tombstone
    assert old.strength == 1.0  # the client's field is never written by decay
    assert stored(old) == pytest.approx(salience(DecayState.of(old), NOW))
    revision = MemoryRevision.objects.get(memory=old)
    assert (revision.source, revision.action, revision.reason, revision.version) == (
        "decay", "forget", "salience_decay", 1)
    assert revision.snapshot["forgotten_at"] is None
    for kept in (fresh, protected, value, drive):
        kept = reload(kept)
        assert kept.forgotten_at is None, kept.kind
        assert kept.version == 1
        assert stored(kept) == pytest.approx(salience(DecayState.of(kept), NOW))
    assert stored(protected) < stack.organization.forget_threshold  # faded, but protected

    assert run.name == "decay"
    assert run.status == JobRun.Status.SUCCEEDED
    assert run.counts == {"scanned": 5, "updated": 5, "forgotten": 1, "batches": batches}
    assert run.duration_ms is not None and run.finished_at is not None
    # Tombstones leave every ordinary read (the memory engine's selector).
    assert set(memories_list(stack=stack).values_list("pk", flat=True)) == {fresh.pk, protected.pk, value.pk,
                                                                           drive.pk}


@pytest.fixture
def compact_memory_table() -> None:
    """The memory table without the dead rows earlier tests left in it (50,000 from the search
    tests: 36,000 pages of nothing), as a deployment's table is: a pass of 1-row batches walks
    every page, which over such a table took a minute and more. The tests that use this are
    transactional, so the table holds no live memory when they start: truncating it leaves exactly
    that. (A VACUUM keeps the pages, and cannot even free them while another session of the worker
    holds an old snapshot.)"""
    with other_connection(autocommit=True) as other:
        other.execute("SET lock_timeout = '10s'")  # a held lock fails the test instead of hanging it
        other.execute("TRUNCATE memories_memory CASCADE")
        other.execute("ANALYZE memories_memory")


# Committed batches, as in a deployment: inside a test's transaction each 1-row batch's temporary
# table keeps its locks to the end, which a sparse table can push past PostgreSQL's lock table.
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("compact_memory_table")
def test_pass_is_idempotent_and_batch_size_does_not_matter(stack):
    memories = [make_memory(stack, days_old=d) for d in (0, 10, 50, 100, 150, 170, 300, 400)]
    # A batch of "1 row" is as many heap pages as the table's statistics say hold one row: one page
    # on a dense table, more when earlier tests' rolled-back rows left it sparse (ANALYZE survives
    # their rollback), so the expected count comes from the pass's own page ranges.
    ranges = _batch_ranges(batch_size=1)
    first = decay_pass(now=NOW, batch_size=1)
    assert first.counts["batches"] == len(ranges)
    assert first.counts["scanned"] == 8
    after_first = decay_state()
    assert sum(1 for _, forgotten, _ in after_first.values() if forgotten) == 4  # 150+ days

    batches = default_batches()
    again = decay_pass(now=NOW)
    counts = {key: again.counts[key] for key in ("scanned", "updated", "forgotten", "batches")}
    assert counts == {"scanned": 4, "updated": 0, "forgotten": 0, "batches": batches}
    assert decay_state() == after_first
    assert len(memories) == 8


def test_later_pass_rewrites_only_rows_that_moved(stack):
    recent = make_memory(stack, days_old=0)
    old = make_memory(stack, "belief", days_old=100)
    decay_pass(now=NOW)
    old_salience = stored(old)
    run = decay_pass(now=NOW + timedelta(hours=6))
    assert run.counts["updated"] == 1  # the fresh one moves fast; the old belief barely moves
    assert stored(old) == old_salience
    assert stored(recent) == pytest.approx(
        salience(DecayState.of(reload(recent)), NOW + timedelta(hours=6)))


def _row_versions() -> dict:
    """Memory id -> (row version, place in the heap): both change when a row is rewritten."""
    rows = sql_rows("SELECT id, xmin::text AS xmin, ctid::text AS ctid FROM memories_memory")
    return {row.id: (row.xmin, row.ctid) for row in rows}


def test_pass_reads_the_memory_table_and_writes_only_the_tombstones_there(stack):
    kept = [make_memory(stack, days_old=d) for d in (0, 30, 90)]
    faded = make_memory(stack, days_old=300)
    before = _row_versions()

    run = decay_pass(now=NOW)

    after = _row_versions()
    assert run.counts["updated"] == 4 and run.counts["forgotten"] == 1
    for memory in kept:  # same row version, same place: never rewritten
        assert after[memory.pk] == before[memory.pk]
        assert stored(memory) == pytest.approx(salience(DecayState.of(memory), NOW))
    assert after[faded.pk] != before[faded.pk]  # the tombstone is a real change of the row
    assert reload(faded).forgotten_reason == "salience_decay"


def test_a_pass_never_overwrites_a_salience_computed_later(stack):
    memory = make_memory(stack, "belief", days_old=100)
    review = record_review(memory=memory, grade=Grade.GOOD, now=NOW + timedelta(days=1))
    # A pass that started before the review (its `now` is earlier) finishes after it.
    batches = default_batches()
    run = decay_pass(now=NOW)
    assert run.counts == {"scanned": 1, "updated": 0, "forgotten": 0, "batches": batches}
    assert stored(memory) == pytest.approx(review.salience)
    assert MemorySalience.objects.get(memory=memory).computed_at == NOW + timedelta(days=1)
    decay_pass(now=NOW + timedelta(days=40))  # a later pass does write
    assert MemorySalience.objects.get(memory=memory).computed_at == NOW + timedelta(days=40)


def test_stored_salience_goes_with_its_memory(stack):
    expiring = make_memory(stack, days_old=10, expires_at=NOW + timedelta(days=1))
    staying = make_memory(stack, days_old=10)
    decay_pass(now=NOW)
    assert MemorySalience.objects.count() == 2
    ttl_purge(now=NOW + timedelta(days=2))
    assert set(MemorySalience.objects.values_list("memory_id", flat=True)) == {staying.pk}
    assert not Memory.objects.filter(pk=expiring.pk).exists()


def test_threshold_is_per_school():
    strict_org = make_org()
    strict_org.forget_threshold = 0.2
    strict_org.save()
    lenient = make_memory(make_stack(make_org()), days_old=60)
    strict = make_memory(make_stack(strict_org), days_old=60)
    decay_pass(now=NOW)
    assert reload(lenient).forgotten_at is None
    assert reload(strict).forgotten_reason == "salience_decay"


def test_archived_stacks_deleted_expired_and_forgotten_rows_are_left_alone(stack):
    archived = make_stack(stack.organization, status=Stack.Status.ARCHIVED)
    frozen = make_memory(archived, days_old=400)
    deleted = make_memory(stack, days_old=400, deleted_at=NOW - timedelta(days=1))
    expired = make_memory(stack, days_old=400, expires_at=NOW - timedelta(days=1))
    manual = make_memory(stack, days_old=400)
    memory_forget(memory=manual, reason="student asked")
    run = decay_pass(now=NOW)
    assert run.counts["scanned"] == 0
    for memory in (frozen, deleted, expired):
        memory = reload(memory)
        assert (memory.forgotten_at, stored(memory), memory.version) == (None, None, 1)
    assert reload(manual).forgotten_reason == "student asked"
    assert forgetting_candidates(stack=archived, now=NOW) == []


def test_sql_salience_matches_the_python_formula(stack):
    rows = [
        make_memory(stack, kind, days_old=days, confidence=conf, times_accessed=hits, emotional_valence=val,
                    emotional_arousal=aro, stability=stab, last_reviewed_at=reviewed)
        for kind, days, conf, hits, val, aro, stab, reviewed in [
            ("episode", 0, 0.8, 0, 0, 0, 1.0, None),
            ("belief", 33.3, 0.95, 4, -0.5, 0.8, 1.0, None),
            ("goal", 500, 0.1, 100_000, 1.0, 1.0, 1.0, None),
            ("raw", 12, 1.4, 0, 2.0, -1.0, 1.0, None),
            ("note", 900, 0.5, 3, 0.2, 0.2, 42.5, NOW - timedelta(days=40)),
            ("playbook", 10, 0.7, 1, 0, 0, 0.01, NOW - timedelta(hours=3)),
            ("relationship", 10, 0.7, 1, 0, 0, 3.0, NOW + timedelta(days=1)),
        ]
    ]
    from_sql = {row.id: row.salience for row in sql_rows(
        f"SELECT m.id, {salience_sql('m', '%(now)s')} AS salience FROM memories_memory m", {"now": NOW})}  # noqa: S608
    for memory in rows:
        assert from_sql[memory.pk] == pytest.approx(salience(DecayState.of(memory), NOW), rel=1e-9)


def test_forgetting_candidates_are_exactly_what_the_next_pass_forgets(stack):
    other_stack = make_stack(stack.organization)
    make_memory(other_stack, days_old=400)
    for days in (1, 100, 160, 250, 400):
        make_memory(stack, days_old=days)
    make_memory(stack, days_old=400, is_protected=True)
    make_memory(stack, "value", days_old=4000)
    later = NOW + timedelta(days=30)

    candidates = forgetting_candidates(stack=stack, now=later)
    saliences = [getattr(c, "current_salience") for c in candidates]  # noqa: B009 - annotated by the query
    assert saliences == sorted(saliences)
    assert all(s < 0.05 for s in saliences)
    assert len(candidates) == 3
    assert len(forgetting_candidates(stack=stack, now=later, limit=2)) == 2

    decay_pass(now=later)
    forgotten = set(Memory.objects.filter(stack=stack, forgotten_at__isnull=False).values_list("pk", flat=True))
    assert forgotten == {c.pk for c in candidates}
    assert forgetting_candidates(stack=stack, now=later) == []


def test_recover_restores_a_decayed_memory_and_the_next_pass_keeps_it(stack):
    old = make_memory(stack, days_old=300)
    decay_pass(now=NOW - timedelta(days=1))
    assert reload(old).forgotten_reason == "salience_decay"
    assert not memories_list(stack=stack).filter(pk=old.pk).exists()

    memory_recover(memory=reload(old))  # the memory engine's service (admin / kernle `recover`)
    assert memories_list(stack=stack).filter(pk=old.pk).exists()

    # The recovery counts as a review: the next passes do not forget it again straight away ...
    decay_pass(now=NOW + timedelta(days=1))
    assert reload(old).forgotten_at is None
    assert forgetting_candidates(stack=stack, now=NOW + timedelta(days=1)) == []
    # ... but it fades again if nobody uses it for months.
    assert forgetting_candidates(stack=stack, now=NOW + timedelta(days=200)) == [reload(old)]
    decay_pass(now=NOW + timedelta(days=200))
    assert reload(old).forgotten_reason == "salience_decay"


def test_recall_restores_a_decayed_memory_and_restarts_its_clock(stack):
    old = make_memory(stack, days_old=300)
    decay_pass(now=NOW)
    assert reload(old).forgotten_at is not None

    result = record_review(memory=old, grade=Grade.GOOD, now=NOW, source="recall")

    assert result.recovered is True
    old = reload(old)
    assert old.forgotten_at is None and old.forgotten_reason == ""
    assert old.last_reviewed_at == NOW
    expected = stability_after_recall(14.0, 5.0, retrievability(300, 14.0), Grade.GOOD)
    assert old.stability == pytest.approx(expected)
    assert old.difficulty == pytest.approx(next_difficulty(5.0, Grade.GOOD))
    assert stored(old) == pytest.approx(0.56) == result.salience  # fresh clock
    assert MemoryRevision.objects.filter(memory=old, action="recover", source="recall").exists()
    assert memories_list(stack=stack).filter(pk=old.pk).exists()
    decay_pass(now=NOW + timedelta(days=30))
    assert reload(old).forgotten_at is None


def test_review_updates_fsrs_state_without_touching_content_version_or_client_fields(stack):
    memory = make_memory(stack, "belief", days_old=30, strength=0.7, times_accessed=3)
    first = record_review(memory=memory, grade=Grade.EASY, now=NOW)
    memory = reload(memory)
    assert first.recovered is False
    assert memory.version == 1 and memory.change_seq == first.memory.change_seq
    assert (memory.strength, memory.times_accessed) == (0.7, 3)
    assert memory.stability == pytest.approx(first.outcome.stability) and memory.stability > 30
    demoted = record_review(memory=memory, grade=Grade.AGAIN, now=NOW + timedelta(days=10))
    assert demoted.outcome.stability < memory.stability
    assert reload(memory).difficulty > memory.difficulty


def test_review_refuses_deliberate_forgets_failed_recalls_of_tombstones_and_missing_rows(stack):
    manual = make_memory(stack, days_old=5)
    memory_forget(memory=manual, reason="manual")
    with pytest.raises(Conflict):
        record_review(memory=manual, grade=Grade.GOOD, now=NOW)
    assert reload(manual).forgotten_at is not None and reload(manual).last_reviewed_at is None

    decayed = make_memory(stack, days_old=400)
    decay_pass(now=NOW)
    with pytest.raises(Conflict):
        record_review(memory=decayed, grade=Grade.AGAIN, now=NOW)
    assert reload(decayed).forgotten_at is not None

    gone = make_memory(stack, deleted_at=NOW)
    expired = make_memory(stack, expires_at=NOW - timedelta(seconds=1))
    for memory in (gone, expired):
        with pytest.raises(NotFound):
            record_review(memory=memory, grade=Grade.GOOD, now=NOW)
        assert reload(memory).last_reviewed_at is None


def _hold_lock_elsewhere(name: str) -> psycopg.Connection:
    other = other_connection(autocommit=True)
    other.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", [JOB_LOCK_NAMESPACE, name])
    return other


def _release_lock_elsewhere(other: psycopg.Connection) -> None:
    # Unlock before closing: a closed client's backend lets go of its locks only when the server
    # gets to it, which on a busy machine can be after the next statement asks.
    other.execute("SELECT pg_advisory_unlock_all()")
    other.close()


def test_an_overlapping_run_is_skipped_and_changes_nothing(stack):
    old = make_memory(stack, days_old=400)
    other = _hold_lock_elsewhere("decay")  # a previous run still going, in another process
    try:
        run = decay_pass(now=NOW)
    finally:
        _release_lock_elsewhere(other)
    assert run.status == JobRun.Status.SKIPPED
    assert run.counts == {"reason": "previous run still in progress"}
    old = reload(old)
    assert (old.forgotten_at, stored(old), old.version) == (None, None, 1)
    # Once the other run is gone the lock is free again.
    assert decay_pass(now=NOW).status == JobRun.Status.SUCCEEDED
    assert reload(old).forgotten_at == NOW


def test_a_failing_run_is_recorded_with_what_it_did_and_releases_the_lock():
    def work(counts: dict[str, Any]) -> None:
        counts["done"] = 7
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        run_job("decay", work)
    run = JobRun.objects.latest("pk")
    assert (run.status, run.counts, run.error) == (JobRun.Status.FAILED, {"done": 7}, "RuntimeError: boom")
    assert run.duration_ms is not None
    assert run_job("decay", lambda counts: None).status == JobRun.Status.SUCCEEDED
