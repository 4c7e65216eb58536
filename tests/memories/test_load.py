"""Budget-aware load: never over budget, priority order, word-boundary truncation, checkpoint
first, forgotten/expired/weak excluded, access counted in one statement."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.throttles import throttle_state_clear
from memories import selectors
from memories.models import Checkpoint, Memory
from memories.privacy.grants import Audience
from memories.reads import load
from memories.services import CheckpointInput, boot_config_set, checkpoint_save, memory_create, memory_forget
from memoryhub import prepared as prepared_statements
from tests.actors import School
from tests.factories import make_org, make_stack, sql_rows, sql_value

pytestmark = pytest.mark.django_db

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "students", "learn",
         "fractions", "and", "decimals"]


@pytest.fixture(autouse=True)
def _fresh_throttles() -> Iterator[None]:
    throttle_state_clear()
    yield


@pytest.fixture
def url(school: School) -> str:
    return school.stack_url("load")


def _sentence(n_words: int, seed: int = 0) -> str:
    return " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(n_words))


def _mixed_stack(stack: Any, per_kind: int = 12) -> None:
    for i in range(per_kind):
        text = _sentence(10 + 17 * i, seed=i)
        memory_create(stack=stack, kind="value", source="test",
                      payload={"name": f"v{i}", "statement": text, "priority": (i * 9) % 101})
        memory_create(stack=stack, kind="belief", source="test",
                      payload={"statement": text, "confidence": round(0.1 + 0.07 * i, 2)})
        memory_create(stack=stack, kind="goal", source="test", payload={"title": f"goal {i}", "description": text})
        memory_create(stack=stack, kind="drive", source="test",
                      payload={"drive_type": f"d{i}", "intensity": round(0.05 + 0.08 * i, 2),
                               "focus_areas": [text[:150]]})
        memory_create(stack=stack, kind="episode", source="test", payload={"objective": text, "outcome": "ok"})
        memory_create(stack=stack, kind="note", source="test", payload={"content": text})
        memory_create(stack=stack, kind="relationship", source="test", payload={
            "entity_name": f"p{i}", "entity_type": "person", "relationship_type": "peer",
            "sentiment": round(-1 + 0.17 * i, 2), "notes": text})


def test_pinned_formula_matches_published_vectors() -> None:
    assert load.priority_score("value", factor=0.8) == pytest.approx(0.86)
    assert load.priority_score("belief", factor=0.9) == pytest.approx(0.78)
    assert load.priority_score("drive", factor=0.7) == pytest.approx(0.64)
    assert load.priority_score("goal", factor=0.7) == pytest.approx(0.67)
    assert load.priority_score("episode", factor=0.7) == pytest.approx(0.52)
    assert load.priority_score("note", factor=0.7) == pytest.approx(0.49)
    assert load.priority_score("relationship", factor=0.5) == pytest.approx(0.38)
    assert load.priority_score("value", factor=0.8, strength=0.6) == pytest.approx(0.43)


def test_sql_scores_equal_the_formula(school: School) -> None:
    stack = school.stack
    memory_create(stack=stack, kind="value", source="t", payload={"name": "n", "statement": "s", "priority": 80})
    memory_create(stack=stack, kind="belief", source="t", payload={"statement": "s", "confidence": 0.9})
    memory_create(stack=stack, kind="drive", source="t", payload={"drive_type": "d", "intensity": 0.7})
    memory_create(stack=stack, kind="goal", source="t", payload={"title": "g"})
    memory_create(stack=stack, kind="episode", source="t", payload={"objective": "o", "outcome": "x"})
    memory_create(stack=stack, kind="note", source="t", payload={"content": "n"})
    memory_create(stack=stack, kind="relationship", source="t", payload={
        "entity_name": "e", "entity_type": "person", "relationship_type": "peer", "sentiment": 0})
    memory_create(stack=stack, kind="belief", source="t", payload={"statement": "fading", "confidence": 0.9,
                                                                      "strength": 0.6})
    result = load.stack_load(stack=stack, budget=8000)
    scores = {(m.kind, m.text): m.score for m in result.memories}
    assert scores == {
        ("value", "n\ns"): 0.86, ("belief", "s"): 0.78, ("drive", "d"): 0.64, ("goal", "g"): 0.67,
        ("episode", "o\nx"): 0.52, ("note", "n"): 0.49, ("relationship", "e"): 0.38, ("belief", "fading"): 0.39,
    }
    assert [m.kind for m in result.memories] == [
        "value", "belief", "goal", "drive", "episode", "note", "belief", "relationship"]


@pytest.mark.parametrize("budget", [100, 300, 1000, 2500, 8000])
def test_budget_never_exceeded_and_priority_order_holds(school: School, url: str, budget: int) -> None:
    _mixed_stack(school.stack)
    checkpoint_save(stack=school.stack, checkpoint=CheckpointInput(task="Fractions unit", progress=_sentence(60)))
    boot_config_set(stack=school.stack, key="tone", value="warm and patient")
    body = school.agent.get(url, {"budget": budget}).json()
    meta = body["meta"]
    assert meta["budget_total"] == budget
    texts = [body["checkpoint"]["text"]] if body["checkpoint"] else []
    texts += [f"{k}: {v}" for k, v in body["boot_config"].items()]
    texts += [m["text"] for m in body["memories"]]
    spent = sum(load.estimate_tokens(t) for t in texts)
    assert spent == meta["budget_used"] <= budget
    scores = [m["score"] for m in body["memories"]]
    assert scores == sorted(scores, reverse=True)
    assert meta["excluded_count"] == 7 * 12 - len(body["memories"])
    assert len(body["echoes"]) == min(20, meta["excluded_count"])


def test_greedy_walk_skips_what_does_not_fit_but_takes_smaller_later_items(school: School) -> None:
    stack = school.stack
    memory_create(stack=stack, kind="value", source="t",
                  payload={"name": "big", "statement": _sentence(80), "priority": 100})
    memory_create(stack=stack, kind="note", source="t", payload={"content": "tiny note"})
    result = load.stack_load(stack=stack, budget=100)
    assert [m.kind for m in result.memories] == ["note"]
    assert result.excluded_count == 1
    assert result.echoes[0]["hint"].startswith("big the quick")


def test_rows_past_the_echo_window_are_loaded_and_echoed_in_full(school: School) -> None:
    """The candidates statement returns the text of the rows that fit whole and of the echo window;
    small rows further down that the walk still takes, and echoes past the window, are read after the
    walk, and come back the same."""
    stack = school.stack
    memory_create(stack=stack, kind="value", source="t",
                  payload={"name": "big", "statement": _sentence(80), "priority": 100})
    # Created first, so walked last (newest first within a score): 11 tokens each, 9 fit in what is left.
    medium = [f"m{i:02d} " + "x" * 28 for i in range(load.ECHO_LIMIT + 10)]
    for text in reversed(medium):
        memory_create(stack=stack, kind="note", source="t", payload={"content": text})
    # 0 tokens each (3 characters at most): every one is taken, the last ones past the window of
    # 2 x ECHO_LIMIT rows after the value, and so every echo after the value's.
    tiny = [f"t{i}" for i in range(50)]
    assert len(tiny) > 2 * load.ECHO_LIMIT
    for text in reversed(tiny):
        memory_create(stack=stack, kind="note", source="t", payload={"content": text})
    result = load.stack_load(stack=stack, budget=100)
    assert [m.text for m in result.memories] == tiny + medium[:9]
    assert result.budget_used == 99 and result.excluded_count == 1 + len(medium) - 9
    assert result.echoes[0]["hint"].startswith("big the quick")
    assert [e["hint"] for e in result.echoes[1:]] == medium[9:9 + load.ECHO_LIMIT - 1]


def test_budget_outside_its_range_is_400_naming_budget(school: School, url: str) -> None:
    """docs/algorithms.md §8.1: 100-50,000 tokens, default 8000; anything else is refused, not clamped."""
    client = school.agent
    assert client.get(url).json()["meta"]["budget_total"] == 8000
    for budget in (100, 8000, 50000):
        assert client.get(url, {"budget": budget}).json()["meta"]["budget_total"] == budget
    for refused in ("-5", "0", "99", "50001", str(10**6), "9" * 30, "lots", "1.5", "1e3"):
        response = client.get(url, {"budget": refused})
        assert response.status_code == 400, refused
        assert list(response.json()["error"]["fields"]) == ["budget"], refused


def test_long_items_truncated_at_word_boundaries(school: School, url: str) -> None:
    text = _sentence(200)
    memory = memory_create(stack=school.stack, kind="note", source="t", payload={"content": text})
    body = school.agent.get(url, {"item_chars": 120}).json()
    item = body["memories"][0]
    assert item["id"] == str(memory.pk)
    assert item["truncated"] is True
    assert len(item["text"]) <= 120
    assert item["text"].endswith("...")
    kept = item["text"][:-3]
    assert text.startswith(kept)
    assert text[len(kept)] == " "  # cut exactly before a space: no word is split
    full = school.agent.get(url, {"no_truncate": "true"}).json()["memories"][0]
    assert full["text"] == text and full["truncated"] is False


def test_truncate_at_word_rules() -> None:
    assert load.truncate_at_word("short", 10) == "short"
    assert load.truncate_at_word("alpha beta gamma delta", 15) == "alpha beta..."
    # No space past the halfway point: a hard cut, still within the limit.
    assert load.truncate_at_word("a " + "x" * 40, 20) == "a " + "x" * 15 + "..."


def test_checkpoint_always_first_even_with_a_tiny_budget(school: School, url: str) -> None:
    _mixed_stack(school.stack, per_kind=3)
    checkpoint_save(stack=school.stack, checkpoint=CheckpointInput(task="old", progress="x"))
    latest = checkpoint_save(stack=school.stack, checkpoint=CheckpointInput(
        task="Long division practice", progress=_sentence(400), next_step="check remainders"))
    body = school.agent.get(url, {"budget": 100}).json()
    assert body["checkpoint"]["id"] == latest.pk
    assert body["checkpoint"]["text"].startswith("Task: Long division practice")
    assert body["checkpoint"]["truncated"] is True
    assert body["meta"]["budget_used"] <= 100
    roomy = school.agent.get(url, {"budget": 50000}).json()
    assert roomy["checkpoint"]["truncated"] is False
    assert "Next: check remainders" in roomy["checkpoint"]["text"]


def test_excluded_memories(school: School, url: str) -> None:
    stack = school.stack
    keep = memory_create(stack=stack, kind="note", source="t", payload={"content": "keep me"})
    forgotten = memory_create(stack=stack, kind="note", source="t", payload={"content": "forget me"})
    memory_forget(memory=forgotten, reason="test")
    memory_create(stack=stack, kind="note", source="t", payload={
        "content": "expired", "expires_at": (timezone.now() - timedelta(seconds=1)).isoformat()})
    memory_create(stack=stack, kind="note", source="t", payload={"content": "weak", "strength": 0.3})
    memory_create(stack=stack, kind="goal", source="t", payload={"title": "done goal", "status": "done"})
    memory_create(stack=stack, kind="belief", source="t", payload={"statement": "old", "is_active": False})
    memory_create(stack=stack, kind="belief", source="t", payload={"statement": "replaced", "superseded_by": "b2"})
    memory_create(stack=stack, kind="raw", source="t", payload={"content": "raw capture"})
    deleted = memory_create(stack=stack, kind="note", source="t", payload={"content": "deleted"})
    Memory.objects.filter(pk=deleted.pk).update(deleted_at=timezone.now())
    other = make_stack(stack.organization, "other")
    memory_create(stack=other, kind="note", source="t", payload={"content": "another stack"})
    body = school.agent.get(url).json()
    assert [m["id"] for m in body["memories"]] == [str(keep.pk)]
    assert body["meta"]["excluded_count"] == 0


def test_access_counted_in_one_update(school: School) -> None:
    _mixed_stack(school.stack, per_kind=2)
    with CaptureQueriesContext(connection) as queries:
        result = load.stack_load(stack=school.stack, budget=8000)
    # One UPDATE statement (sent in the same round trip as the read of the returned rows).
    assert sum(q["sql"].upper().count("UPDATE MEMORIES_MEMORY") for q in queries.captured_queries) == 1
    loaded = {m.id for m in result.memories}
    assert len(loaded) == 14
    rows = Memory.objects.filter(stack=school.stack)
    assert {str(m.pk) for m in rows if m.times_accessed == 1 and m.last_accessed is not None} == loaded
    before = {m.pk: (m.version, m.change_seq) for m in rows}
    # Loads closer together than the resolution are one use: the second changes nothing.
    first_at = {m.pk: m.last_accessed for m in rows}
    soon = timezone.now() + timedelta(seconds=load.ACCESS_RESOLUTION_SECONDS - 60)
    with CaptureQueriesContext(connection) as queries:
        load.stack_load(stack=school.stack, budget=8000, now=soon)
    # Nothing to count, so no UPDATE is sent at all: the candidates said so.
    assert not any("UPDATE MEMORIES_MEMORY" in q["sql"].upper() for q in queries.captured_queries)
    again = {m.pk: (m.times_accessed, m.last_accessed) for m in Memory.objects.filter(stack=school.stack)}
    assert all(again[pk] == (1, first_at[pk]) for pk in before if str(pk) in loaded)
    later = timezone.now() + timedelta(seconds=load.ACCESS_RESOLUTION_SECONDS + 60)
    load.stack_load(stack=school.stack, budget=8000, now=later)
    after = {m.pk: (m.version, m.change_seq, m.times_accessed, m.last_accessed)
             for m in Memory.objects.filter(stack=school.stack)}
    assert all(after[pk][:2] == before[pk] and after[pk][2:] == (2, later) for pk in before)  # bookkeeping, not an edit


def test_boot_config_included_in_load(school: School, url: str) -> None:
    boot_config_set(stack=school.stack, key="name", value="Ada")
    boot_config_set(stack=school.stack, key="grade", value="5")
    body = school.agent.get(url).json()
    assert body["boot_config"] == {"grade": "5", "name": "Ada"}
    assert body["checkpoint"] is None


def test_item_details_are_the_kind_fields(school: School) -> None:
    value = memory_create(stack=school.stack, kind="value", source="test",
                          payload={"name": "honesty", "statement": "tell the truth", "priority": 80})
    person = memory_create(stack=school.stack, kind="relationship", source="test", payload={
        "entity_name": "Ada", "entity_type": "person", "relationship_type": "peer", "sentiment": 0.5})
    result = load.stack_load(stack=school.stack, budget=8000)
    details = {item.id: (item.kind, item.details) for item in result.memories}
    assert details[str(value.pk)] == ("value", {"name": "honesty", "priority": 80})
    assert details[str(person.pk)] == ("relationship", {"entity_name": "Ada", "entity_type": "person",
                                                        "sentiment": 0.5})


def test_rows_stored_compressed_come_back_whole_in_the_same_round_trips(school: School) -> None:
    """A row whose text or `data` PostgreSQL stores compressed comes back from the candidates
    statement's read by address as whole as a short row does (docs/algorithms.md §8.4, "Rows with
    their text"): the same record id, head of the text and detail fields, and a stack that fits is
    still two round trips."""
    stack = school.stack
    short = memory_create(stack=stack, kind="note", source="t",
                          payload={"content": "a short note", "note_type": "idea"})
    long_text = _sentence(1200, seed=3)
    long = memory_create(stack=stack, kind="note", source="t", payload={"content": long_text, "note_type": "insight"})
    lessons = [_sentence(60, seed=k) for k in range(40)]
    episode = memory_create(stack=stack, kind="episode", source="t",
                            payload={"objective": "fix the build", "outcome": "it builds", "outcome_type": "success",
                                     "lessons": lessons})
    stored = {row.id: (row.text_compressed, row.data_compressed) for row in sql_rows(
        "SELECT id::text AS id, pg_column_compression(text) IS NOT NULL AS text_compressed, "
        "pg_column_compression(data) IS NOT NULL AS data_compressed FROM memories_memory WHERE stack_id = %s",
        [stack.pk])}
    assert stored[str(short.pk)] == (False, False)
    assert stored[str(long.pk)][0] and stored[str(episode.pk)][1], stored  # one text, one data compressed

    with CaptureQueriesContext(connection) as queries:
        result = load.stack_load(stack=stack, budget=50000, item_chars=300, track_access=False)
    sent = [q["sql"] for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
    assert len(sent) == 2, [sql[:80] for sql in sent]  # the working state, then the candidates
    items = {item.id: item for item in result.memories}
    assert set(items) == {str(short.pk), str(long.pk), str(episode.pk)}
    assert (items[str(short.pk)].text, items[str(short.pk)].details) == ("a short note", {"note_type": "idea"})
    assert items[str(long.pk)].truncated and long_text.startswith(items[str(long.pk)].text[:-3])
    assert items[str(long.pk)].details == {"note_type": "insight"}
    assert items[str(long.pk)].record_id == long.record_id
    assert items[str(episode.pk)].details == {"outcome_type": "success"}
    assert items[str(episode.pk)].created_at == episode.created_at


@pytest.mark.django_db(transaction=True)
def test_load_in_its_own_transaction_commits_counts_and_scopes_its_settings() -> None:
    stack = make_stack(make_org(), "own-tx")
    note = memory_create(stack=stack, kind="note", source="test", payload={"content": "remember fractions"})
    sync_before, cost_before = sql_value("SHOW synchronous_commit"), sql_value("SHOW random_page_cost")
    assert not connection.in_atomic_block
    result = load.stack_load(stack=stack, budget=8000)
    assert [item.id for item in result.memories] == [str(note.pk)]
    # SET LOCAL ended with the load's own transaction.
    assert sql_value("SHOW synchronous_commit") == sync_before
    assert sql_value("SHOW random_page_cost") == cost_before
    assert sql_value("SHOW plan_cache_mode") == "auto" and sql_value("SHOW enable_bitmapscan") == "on"
    load.stack_load(stack=stack, budget=8000)  # within the access resolution: not counted again
    note.refresh_from_db()
    assert note.times_accessed == 1 and note.last_accessed is not None


def _prepared_candidates_statements() -> dict[str, tuple[int, int]]:
    """This database session's prepared candidates statements: name -> (generic plans, custom plans)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, generic_plans, custom_plans FROM pg_prepared_statements "
                       "WHERE name LIKE %s", [f"{load.PREPARED_NAME}_%"])
        return {name: (generic, custom) for name, generic, custom in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_the_prepared_candidates_statement_loads_as_the_plain_one(school: School, settings: Any) -> None:
    """The candidates statement is prepared once per database session and run with a generic plan
    (docs/algorithms.md §8.4). Whatever the budget, the item size and the requester, a load
    returns exactly what the plain statement gives, and from its second run on the session executes
    the prepared plan instead of parsing and planning the statement again."""
    _mixed_stack(school.stack)
    memory_create(stack=school.stack, kind="value", source="test",
                  payload={"name": "hidden", "statement": "kept from staff", "priority": 100,
                           "access_grants": ["human:someone-else"]})
    prepared_statements._PREPARED.pop(connection.connection, None)  # as in a new session
    before = _prepared_candidates_statements()
    staff = Audience(entity_ids=("role:teacher", "*"), empty_admits=True)
    cases: list[dict[str, Any]] = [{"budget": 8000}, {"budget": 300}, {"budget": 2500, "item_chars": 40},
                                   {"budget": 8000, "audience": staff}]

    def loaded(case: dict[str, Any]) -> tuple[Any, ...]:
        result = load.stack_load(stack=school.stack, track_access=False, **case)
        return ([(item.id, item.text, item.score, item.tokens) for item in result.memories], result.echoes,
                result.budget_used, result.excluded_count)

    for case in cases:
        settings.DB_PREPARED_STATEMENTS = False
        plain = loaded(case)
        settings.DB_PREPARED_STATEMENTS = True
        assert loaded(case) == plain, case  # the first run prepares the statement
        assert loaded(case) == plain, case  # the second executes it
        assert plain[0], case
    everyone, staff_only = loaded(cases[0]), loaded(cases[3])
    assert len(staff_only[0]) == len(everyone[0]) - 1  # the grants did apply in the prepared statement
    prepared = {name: plans for name, plans in _prepared_candidates_statements().items() if name not in before}
    # One statement per grants shape, not one per load; every run of it on the generic plan.
    assert sorted(prepared.values()) == [(3, 0), (7, 0)], prepared


@pytest.mark.django_db(transaction=True)
def test_the_generic_candidates_plan_walks_each_kinds_index(school: School) -> None:
    """The one plan every stack's load runs (§8.4): a walk of the (stack, kind, created_at) index
    per kind, stopped by its limit, and a read by address of the rows it returns with their text; no
    other read of the memories table, so no stack is sorted whole."""
    _mixed_stack(school.stack, per_kind=3)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memories_memory")
    load.stack_load(stack=school.stack)  # prepares it on this session
    name, names = prepared_statements._PREPARED[connection.connection][load._candidates_sql()]
    values: dict[str, Any] = {"cap": load.DEFAULT_ITEM_CHARS, "stack": school.stack.pk, "now": timezone.now(),
                              "budget": load.DEFAULT_BUDGET, "resolution": load.ACCESS_RESOLUTION_SECONDS,
                              "head": load.DEFAULT_ITEM_CHARS + 1}
    with connection.cursor() as cursor:
        # The settings each EXECUTE is sent with: a plan made again (after an ANALYZE) is made under them.
        cursor.execute(f"SET LOCAL random_page_cost = {load.CANDIDATE_RANDOM_PAGE_COST}; {load._ONE_PLAN_SQL}"
                       "SET LOCAL plan_cache_mode = force_generic_plan; "
                       f"EXPLAIN EXECUTE {name}({', '.join(['%s'] * len(names))})", [values[n] for n in names])
        while cursor.nextset():
            pass
        plan = [row[0] for row in cursor.fetchall()]
    reads = [line.strip() for line in plan if " on memories_memory" in line]
    walks = [read for read in reads if read.startswith("->  Index Scan using memories_stack_kind_created")]
    # The one other read: the rows returned with their text, fetched by the address the walks found.
    assert len(walks) == len(load.LOAD_KINDS) and len(reads) == len(walks) + 1, plan
    assert next(read for read in reads if read not in walks).startswith("->  Tid Scan on memories_memory"), reads


def test_working_state_reads_what_the_querysets_read_in_one_round_trip(school: School) -> None:
    """The checkpoint and boot config a load starts with (memories.selectors.working_state): the
    queryset's latest checkpoint, field by field, and the boot config in key order; nothing of
    another stack; one query string."""
    assert selectors.working_state(stack=school.stack) == (None, [])
    saved = timezone.now() - timedelta(hours=2)
    checkpoint_save(stack=school.stack, checkpoint=CheckpointInput(task="old", progress="x"))
    checkpoint_save(stack=school.stack, checkpoint=CheckpointInput(
        task="Long division", progress="half way", next_step="remainders", blocker="none",
        context={"text": "carry the one", "nested": {"n": [1, 2]}}, pending=["check 3", "check 4"], saved_at=saved))
    checkpoint_save(stack=school.other_stack, checkpoint=CheckpointInput(task="someone else's"))
    boot_config_set(stack=school.stack, key="tone", value="warm")
    boot_config_set(stack=school.stack, key="name", value="Ada")
    boot_config_set(stack=school.other_stack, key="secret", value="not yours")

    with CaptureQueriesContext(connection) as queries:
        checkpoint, boot = selectors.working_state(stack=school.stack)
    assert len(queries) == 1
    expected = selectors.checkpoint_latest(stack=school.stack)
    assert checkpoint is not None and expected is not None and expected.task == "Long division"
    fields = [field.attname for field in Checkpoint._meta.concrete_fields]
    assert [getattr(checkpoint, name) for name in fields] == [getattr(expected, name) for name in fields]
    assert checkpoint.context == {"text": "carry the one", "nested": {"n": [1, 2]}} and checkpoint.saved_at == saved
    assert boot == list(school.stack.boot_config.order_by("key").values_list("key", "value")) == [
        ("name", "Ada"), ("tone", "warm")]
