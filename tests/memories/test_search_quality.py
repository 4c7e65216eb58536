"""Search ranking v2 (docs/algorithms.md §7.5): the BM25 keyword leg and the neighbouring-turn
context, next to the previous ranking, v1, which the benchmark keeps as its baseline
(bench/search_rankings.py).

Memories are written unembedded where only the keyword leg should answer, so what is asserted is
the ranking itself, not the hash embedder's accidental similarities."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bench.search_rankings import search_ranked
from memories.models import Memory
from memories.search import keyword_leg, vector_indexes
from memories.search.context import CONTEXT_MAX_GAP
from memories.search.embedding_jobs import memories_embed
from memories.search.fusion import CONTEXT_DECAY, CONTEXT_SHARE
from memories.search.hybrid import search_memories
from memories.search.keyword_leg import BM25_B, BM25_K1, _bm25_params
from memories.search.query import SearchQuery
from memories.services import memory_create, memory_forget
from stacks.models import Stack
from tests.factories import make_org, make_stack

pytestmark = pytest.mark.django_db


def turn(stack: Stack, content: str, at: datetime, kind: str = "note") -> Memory:
    payload = {"content": content} if kind == "note" else {"statement": content}
    return memory_create(stack=stack, kind=kind, payload={**payload, "created_at": at.isoformat()}, source="api")


def search(stack_ids: list[int], text: str, **query: Any) -> list[Any]:
    return search_memories(stack_ids=stack_ids, query=SearchQuery(text=text, min_similarity=0.0, **query)).hits


def ids(hits: list[Any]) -> list[Any]:
    return [hit.memory.pk for hit in hits]


@pytest.fixture
def school() -> dict[str, Any]:
    org = make_org()
    return {"org": org, "stack": make_stack(org, "alice"), "other": make_stack(org, "bob")}


@pytest.fixture
def t0() -> datetime:
    return timezone.now() - timedelta(hours=3)


def test_the_answer_turn_next_to_the_matching_question_is_found_and_says_why(school: dict[str, Any],
                                                                               t0: datetime) -> None:
    stack = school["stack"]
    question = turn(stack, "Mel, what did you paint over the summer holidays?", t0)
    answer = turn(stack, "A sunrise over the lake, I finished it in July 2022!", t0 + timedelta(seconds=30))
    turn(stack, "Unrelated: the bus leaves at eight.", t0 + timedelta(hours=2))
    hits = search([stack.pk], "What did Mel paint over the summer?")
    assert ids(hits)[:2] == [question.pk, answer.pk]
    lent = hits[1]
    # Found by neither leg: only the neighbour's context put it there, and the hit says so.
    assert lent.keyword_rank is None and lent.semantic_rank is None
    assert lent.context_of == question.pk
    assert lent.boosts["context"] == pytest.approx(CONTEXT_SHARE * hits[0].combined_score, abs=1e-6)
    assert lent.combined_score == pytest.approx(lent.boosts["context"], abs=1e-6)
    assert hits[0].boosts == {}
    # The previous ranking (the benchmark's baseline) has no context: the answer is not found.
    v1 = search_ranked("v1", stack_ids=[stack.pk],
                       query=SearchQuery(text="What did Mel paint over the summer?", min_similarity=0.0)).hits
    assert answer.pk not in ids(v1)


def test_a_temporal_question_finds_the_dated_memory(school: dict[str, Any], t0: datetime) -> None:
    """'When did …' is answered by a date that sits in the next turn, not in the matching one."""
    stack = school["stack"]
    turn(stack, "Did I tell you about the charity race I ran?", t0)
    dated = turn(stack, "It was on 20 May 2023, the Sunday before last.", t0 + timedelta(seconds=40))
    turn(stack, "The science fair is next week.", t0 + timedelta(seconds=80))
    hits = search([stack.pk], "When did she run the charity race?")
    assert dated.pk in ids(hits)
    assert next(h for h in hits if h.memory.pk == dated.pk).boosts.get("context", 0) > 0


def test_context_never_crosses_a_session_pause(school: dict[str, Any], t0: datetime) -> None:
    stack = school["stack"]
    turn(stack, "We talked about the volcano model for the science fair.", t0)
    later = turn(stack, "Good morning! New day.", t0 + CONTEXT_MAX_GAP + timedelta(seconds=1))
    hits = search([stack.pk], "volcano model")
    assert later.pk not in ids(hits)


def test_context_never_crosses_stacks_kinds_or_forgotten_memories(school: dict[str, Any], t0: datetime) -> None:
    stack, other = school["stack"], school["other"]
    elsewhere = make_stack(make_org(), "carol")  # another school
    turn(stack, "The volcano model needs baking soda.", t0)
    neighbours = [
        turn(other, "Bob's private diary line.", t0 + timedelta(seconds=10)),
        turn(elsewhere, "Another school's memory.", t0 + timedelta(seconds=20)),
        turn(stack, "A belief written right after.", t0 + timedelta(seconds=30), kind="belief"),
    ]
    forgotten = turn(stack, "A forgotten turn right before.", t0 - timedelta(seconds=10))
    memory_forget(memory=forgotten, reason="test")
    hits = search([stack.pk], "volcano model")
    assert len(hits) == 1 and hits[0].boosts == {}
    for memory in [*neighbours, forgotten]:
        assert memory.pk not in ids(hits)
    # And the other way round: the other stack's search is not lent this stack's hit.
    assert search([other.pk], "diary") and all(h.memory.stack_id == other.pk for h in search([other.pk], "diary"))
    assert search([elsewhere.pk], "volcano model") == []


def test_bm25_prefers_the_rare_term_to_a_repeated_common_one(school: dict[str, Any], t0: datetime) -> None:
    stack = school["stack"]
    for i in range(8):
        turn(stack, f"Homework for week {i}: homework homework, more homework.", t0 + timedelta(hours=i))
    rare = turn(stack, "The homework on photosynthesis is due Friday.", t0 + timedelta(hours=20))
    hits = search([stack.pk], "photosynthesis homework")
    assert hits[0].memory.pk == rare.pk
    # It holds both words once, at about the matched rows' mean length: about the query's weight.
    assert hits[0].keyword_score is not None and hits[0].keyword_score > 0.85
    # Term-frequency saturation: four repeats of the common word do not outrank the rare one.
    assert all(h.keyword_score is not None and h.keyword_score < 0.5 for h in hits[1:])


def test_the_turn_two_away_gets_half_the_share(school: dict[str, Any], t0: datetime) -> None:
    stack = school["stack"]
    seed = turn(stack, "Which museum did the class visit on the field trip?", t0)
    near = turn(stack, "Guess!", t0 + timedelta(seconds=20))
    far = turn(stack, "The natural history one, with the dinosaur skeletons.", t0 + timedelta(seconds=40))
    hits = {hit.memory.pk: hit for hit in search([stack.pk], "museum field trip")}
    top = hits[seed.pk].combined_score
    assert hits[near.pk].boosts["context"] == pytest.approx(CONTEXT_SHARE * top, abs=1e-6)
    assert hits[far.pk].boosts["context"] == pytest.approx(CONTEXT_SHARE * CONTEXT_DECAY * top, abs=1e-6)
    assert hits[far.pk].context_of == seed.pk


def bm25_reference(stack: Stack, query: str) -> tuple[dict[Any, float], float]:
    """Okapi BM25 of every memory of `stack` that holds a query lexeme, straight from the tsvector's
    own positions (unnest, the way the first v2 counted them): what the keyword leg must compute;
    and the query's weight (keyword_leg.QUERY_WEIGHT): Σ idf of the query lexemes some memory holds,
    a lexeme none holds counted at their mean."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT tsvector_to_array(to_tsvector('english', %s))", [query])
        lexemes = set(cursor.fetchone()[0])
        cursor.execute("SELECT m.id, length(m.search_vector), u.lexeme, array_length(u.positions, 1) "
                       "FROM memories_memory m, unnest(m.search_vector) u WHERE m.stack_id = %s", [stack.pk])
        rows = cursor.fetchall()
    length = {memory_id: dl for memory_id, dl, _, _ in rows}
    tf = {(memory_id, lexeme): n for memory_id, _, lexeme, n in rows if lexeme in lexemes}
    matched = {memory_id for memory_id, _ in tf}
    avgdl = sum(length[m] for m in matched) / len(matched)
    df = {lexeme: sum(1 for m in matched if (m, lexeme) in tf) for lexeme in lexemes}
    idf = {t: math.log(1 + (len(length) - df[t] + 0.5) / (df[t] + 0.5)) for t in lexemes if df[t]}
    scores = {}
    for m in matched:
        norm = BM25_K1 * (1 - BM25_B + BM25_B * length[m] / avgdl)
        scores[m] = sum(idf[t] * tf[m, t] * (BM25_K1 + 1) / (tf[m, t] + norm) for t in lexemes if (m, t) in tf)
    return scores, sum(idf.values()) * len(lexemes) / max(len(idf), 1)


@pytest.mark.parametrize("inline_max", [keyword_leg.BM25_INLINE_MAX_LEXEMES, 0], ids=["inline", "long-query"])
def test_the_keyword_leg_is_exact_bm25_with_term_frequencies(school: dict[str, Any], t0: datetime,
                                                             monkeypatch: pytest.MonkeyPatch, inline_max: int) -> None:
    """The leg reads tf from each row's query lexemes (no per-row unnest; a query with more lexemes
    than BM25_INLINE_MAX_LEXEMES unnests them) and must score exactly what BM25 over the tsvector's
    positions gives - repeats and lengths included."""
    monkeypatch.setattr(keyword_leg, "BM25_INLINE_MAX_LEXEMES", inline_max)
    stack = school["stack"]
    texts = ["Pizza, pizza and more pizza for dinner tonight.",
             "Pizza for dinner.",
             "We had dinner at the new Thai place and talked about the science fair for hours.",
             "Dinner, dinner, dinner: the only word the toddler knows.",
             "Homework first, then the football match.",
             "The pizza oven at school is broken again."]
    for i, text in enumerate(texts):
        turn(stack, text, t0 + timedelta(hours=i))  # unembedded: the keyword leg alone ranks
    query = "pizza dinner tonight"
    expected, weight = bm25_reference(stack, query)
    hits = search([stack.pk], query, limit=10)
    scale = max(*expected.values(), weight)
    assert {h.memory.pk for h in hits} == set(expected)
    for hit in hits:
        assert hit.keyword_score == pytest.approx(expected[hit.memory.pk] / scale, rel=1e-9)
    # The repeats count (saturated): three "pizza" beat one in an otherwise shorter memory.
    assert ids(hits)[0] == Memory.objects.get(stack=stack, text__startswith="Pizza, pizza").pk


@pytest.mark.parametrize("inline_max", [keyword_leg.BM25_INLINE_MAX_LEXEMES, 0], ids=["inline", "long-query"])
def test_a_best_keyword_hit_holding_part_of_the_query_is_not_a_full_match(school: dict[str, Any], t0: datetime,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           inline_max: int) -> None:
    """The leg's scores are scaled by the query's weight (Σ idf of its words the stack holds) when
    the best hit scores less: two memories holding one rare query word each are half matches, not
    both "the best"; a memory holding both is a full match (docs/algorithms.md §7.6)."""
    monkeypatch.setattr(keyword_leg, "BM25_INLINE_MAX_LEXEMES", inline_max)
    stack = school["stack"]
    halves = [turn(stack, "Notes on photosynthesis for the test.", t0),
              turn(stack, "Notes on volcanoes for the test.", t0 + timedelta(hours=1))]
    for i in range(4):
        turn(stack, f"Notes on week {i} for the test.", t0 + timedelta(hours=2 + i))
    hits = {h.memory.pk: h for h in search([stack.pk], "photosynthesis volcanoes")}
    expected, weight = bm25_reference(stack, "photosynthesis volcanoes")
    for half in halves:
        assert hits[half.pk].keyword_score == pytest.approx(expected[half.pk] / weight, rel=1e-9)
        assert 0.4 < (hits[half.pk].keyword_score or 0) < 0.6
    # A word the stack lacks counts at the found words' mean: holding one of three is a third of a match.
    hits = {h.memory.pk: h for h in search([stack.pk], "photosynthesis volcanoes earthquakes")}
    expected, weight = bm25_reference(stack, "photosynthesis volcanoes earthquakes")
    assert weight == pytest.approx(1.5 * bm25_reference(stack, "photosynthesis volcanoes")[1])
    for half in halves:
        assert hits[half.pk].keyword_score == pytest.approx(expected[half.pk] / weight, rel=1e-9)
    both = turn(stack, "Notes on photosynthesis and volcanoes for the test.", t0 + timedelta(hours=7))
    hits = {h.memory.pk: h for h in search([stack.pk], "photosynthesis volcanoes")}
    expected, weight = bm25_reference(stack, "photosynthesis volcanoes")
    assert hits[both.pk].keyword_score == pytest.approx(expected[both.pk] / max(*expected.values(), weight), rel=1e-9)
    assert (hits[both.pk].keyword_score or 0) > 0.9  # a little longer than the mean: a little under the weight
    assert all((hits[half.pk].keyword_score or 1) < 0.6 for half in halves)


def test_a_turn_between_two_hits_gets_both_shares_but_never_outranks_its_lender(school: dict[str, Any],
                                                                               t0: datetime) -> None:
    stack = school["stack"]
    strong = turn(stack, "The volcano model erupted with baking soda and vinegar.", t0)
    between = turn(stack, "Wow, what happened next?", t0 + timedelta(seconds=20))
    weak = turn(stack, "We cleaned the volcano afterwards.", t0 + timedelta(seconds=40))
    hits = search([stack.pk], "volcano baking soda")
    order = ids(hits)
    by_id = {h.memory.pk: h for h in hits}
    lent = by_id[between.pk]
    assert lent.keyword_rank is None and lent.semantic_rank is None and lent.context_of == strong.pk
    assert by_id[strong.pk].boosts == {}  # the weaker hit two turns away cannot lift it
    # The shares use the lenders' own scores (before context): the weak hit's, less what it was lent.
    lenders = by_id[strong.pk].combined_score, by_id[weak.pk].combined_score - by_id[weak.pk].boosts.get("context", 0)
    # Both shares, capped at the score of the hit that lent the most.
    assert lent.combined_score == pytest.approx(min(CONTEXT_SHARE * sum(lenders), lenders[0]), abs=1e-6)
    assert order.index(strong.pk) < order.index(between.pk)


def test_the_term_literals_find_quotes_and_backslashes_in_a_tsvector() -> None:
    r"""The english parser never makes such lexemes, but a tsvector can hold them: each lexeme's
    one-term tsquery must match exactly its own entry, and count its positions."""
    lexemes = ["it's", "a\\b", "s"]
    params = _bm25_params(lexemes)
    vector = r"'it''s':1 'a\\b':2,5 's':3 'x':9,10"
    with connection.cursor() as cursor:
        for i, lexeme in enumerate(lexemes):
            sql = (f"SELECT m.search_vector @@ %(term_{i})s::tsquery, {keyword_leg._tf_sql(i)}, "  # noqa: S608 - fixed SQL
                   f"ts_delete(m.search_vector, %(lexeme)s) @@ %(term_{i})s::tsquery "
                   f"FROM (SELECT %(vector)s::tsvector AS search_vector) m")
            cursor.execute(sql, {**params, "vector": vector, "lexeme": lexeme})
            present, tf, present_without_it = cursor.fetchone()
            assert present, lexeme
            assert tf == (2 if lexeme == "a\\b" else 1), lexeme
            assert not present_without_it, lexeme  # the entry it matched is that lexeme's, no other
    assert params["lexemes"] == lexemes


def test_term_frequency_is_read_exactly_for_every_count_a_tsvector_holds() -> None:
    """tf from ts_rank (keyword_leg._tf_sql inverts Σ 1/j²): exact from 1 to 256 positions, the most a
    tsvector keeps for one lexeme - float4 rounding included."""
    vectors = [" ".join([f"'pizza':{','.join(str(p) for p in range(1, n + 1))}", "'dinner':300"])
               for n in range(1, 257)]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {keyword_leg._tf_sql(0)} FROM unnest(%(vectors)s::tsvector[]) AS m(search_vector)",  # noqa: S608
                       {**_bm25_params(["pizza"]), "vectors": vectors})
        counts = [int(row[0]) for row in cursor.fetchall()]
    assert counts == list(range(1, 257))


def test_ranking_v2_costs_no_more_statements_than_v1(school: dict[str, Any], t0: datetime,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Latency (§7.5 "Cost"): v2's extra reads ride on statements v1 sends anyway - the query's lexemes
    and BM25's N (the stacks' counters) on the first statement, the keyword hits' cosine on the
    vector leg, the page's rows on the neighbouring-turn statement - so a v2 search is no more
    round trips than a v1 search."""
    # The term statistics (v2 only) and the indexed stacks come from caches a process rereads every
    # few seconds, not per search (§7.1): held warm here, so a cache that ran out between the two
    # searches is not charged to one of them.
    monkeypatch.setattr(keyword_leg, "_TERM_STATS_SECONDS", math.inf)
    monkeypatch.setattr(vector_indexes, "_CACHE_SECONDS", math.inf)
    keyword_leg._term_stats()
    vector_indexes.stacks_with_vector_index(refresh=True)
    stack = school["stack"]
    texts = ["Mel, what did you paint over the summer holidays?", "A sunrise over the lake, finished in July!",
             "Nice. Did you go camping too?", "Yes, with the kids, near the lake."]
    memories_embed(ids=[turn(stack, text, t0 + timedelta(seconds=30 * i)).pk for i, text in enumerate(texts)])
    counts = {}
    for ranking, text in (("v1", "what did Mel paint at the lake"), ("v2", "what did Mel paint at the lake?")):
        query = SearchQuery(text=text, min_similarity=0.0)
        with CaptureQueriesContext(connection) as captured:
            if ranking == "v1":  # the benchmark's baseline (bench/search_rankings.py)
                result = search_ranked("v1", stack_ids=[stack.pk], query=query)
            else:
                result = search_memories(stack_ids=[stack.pk], query=query)
        assert result.legs == {"keyword": "ran", "semantic": "ran"} and len(result.hits) == 4
        counts[ranking] = len(captured)
    assert counts["v2"] <= counts["v1"], counts


def test_the_page_read_with_the_context_is_the_memory_the_orm_reads(school: dict[str, Any], t0: datetime) -> None:
    stack = school["stack"]
    first = memory_create(stack=stack, kind="note", source="api", payload={
        "content": "The volcano model needs baking soda.", "tags": ["science", "fair"],
        "created_at": t0.isoformat()})
    second = turn(stack, "And vinegar, lots of it.", t0 + timedelta(seconds=20))
    hits = {hit.memory.pk: hit.memory for hit in search([stack.pk], "volcano model baking soda")}
    assert set(hits) == {first.pk, second.pk}
    for memory in hits.values():
        fresh = Memory.objects.defer("embedding", "search_vector").get(pk=memory.pk)
        assert {"embedding", "search_vector"} <= memory.get_deferred_fields()
        for field in Memory._meta.concrete_fields:
            if field.attname not in ("embedding", "search_vector"):
                assert getattr(memory, field.attname) == getattr(fresh, field.attname), field.attname
    assert hits[first.pk].tags == ["science", "fair"] and isinstance(hits[first.pk].data, dict)
