"""Fusion and ranking of hybrid search: the legs' candidates to one scored, explained page
(docs/algorithms.md §7.2, §7.5).

    retention   = FSRS retrievability R(t, S) of the memory (memories.lifecycle.decay.memory_retrievability:
                  t = days since last review or creation, S = its effective stability)
    recency     = 0.95 ^ min(age in days, 30)
    weight      = (0.6 + 0.4·retention) · (0.6 + 0.4·confidence) · (0.85 + 0.15·recency)
    fused       = (2/60) · (0.5·keyword + 0.5·semantic)      keyword: BM25 / max(the leg's best, the
                                                             query's weight), semantic: the cosine
                                                             min-max scaled
    combined    = min(1, fused · weight / (2/60))            ∈ [0, 1]

so a memory first in both legs, fully retained, fully confident and new scores 1.0 (the scale of
reciprocal rank fusion, 1/(RRF_K + rank) per leg, which the ranking used before; §7.2). The best
hits then lend 0.6 of their score to the turns just before and after them (0.3 two away;
memories.search.context), shares from several hits adding up, but never past the hit that lent
the most (§7.6); `SearchHit.boosts` says so.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memories.lifecycle.decay import DecayState, memory_retrievability
from memories.models import Memory
from memories.privacy.grants import Audience
from memories.search.context import memories_from_rows, neighbour_rows
from memories.search.keyword_leg import QUERY_WEIGHT
from memories.search.query import LEG_FIELD_INDEXES, SCORE, SearchHit, SearchQuery, scope_filters

RRF_K = 60


def ranking_weight(*, retention: float, confidence: float, age_days: float) -> float:
    recency = 0.95 ** min(max(age_days, 0.0), 30.0)
    confidence = min(max(confidence, 0.0), 1.0)
    return (0.6 + 0.4 * retention) * (0.6 + 0.4 * confidence) * (0.85 + 0.15 * recency)


# Neighbouring-turn context (memories.search.context, docs/algorithms.md §7.5): the best
# CONTEXT_SEEDS hits each lend CONTEXT_SHARE of their combined score to the memory just before and
# just after them in the same session, and half that to the turns two away; a memory lent by several
# hits gets the sum, never above the score of the best hit that lent to it (`apply_context`). The
# share is chosen by leave-one-conversation-out cross-validation (§7.6); the window, decay and seeds
# are §7.5's, flat on every fold (§7.6).
# 5 seeds, not 10: the same recall, and the neighbour statement makes half the index scans.
CONTEXT_SEEDS = 5
CONTEXT_SHARE = 0.6
CONTEXT_WINDOW = 2  # turns on each side
CONTEXT_DECAY = 0.5  # the share's factor per further turn: the second turn away gets half


# Score fusion (§7.5): each leg's score scaled to [0, 1] within this search - BM25 by the best
# keyword hit, the cosine min-max over the vector leg's candidates - then mixed with KEYWORD_WEIGHT,
# and put on RRF's scale (a hit first in both legs gets 2/RRF_K) so `combined` reads as before.
# FUSION_DEPTH: candidates per leg. 30 (= the over-fetch at limit 10) kept the dev split's recall
# of deeper lists and costs less per leg (§7.5). KEYWORD_WEIGHT: cross-validated (§7.6) on a grid
# bounded at 0.5, the bound set so that a memory answering by meaning stays above one that only
# shares a word with the question in a small store; §7.6 says what a higher bound would choose.
KEYWORD_WEIGHT = 0.5
FUSION_DEPTH = 30


@dataclass(frozen=True)
class RankingConstants:
    """The ranking's tuned constants in one object (docs/algorithms.md §7.5, §7.6). The service
    always ranks with RANKING; bench/retrieval_quality.py passes other values to search its grids
    (leave-one-conversation-out, §7.6) - a value, not a switch: the served path has one ranking."""
    keyword_weight: float = KEYWORD_WEIGHT
    fusion_depth: int = FUSION_DEPTH
    context_seeds: int = CONTEXT_SEEDS
    context_share: float = CONTEXT_SHARE
    context_window: int = CONTEXT_WINDOW
    context_decay: float = CONTEXT_DECAY


RANKING = RankingConstants()


def _semantic_range(sims: Sequence[float]) -> tuple[float, float]:
    if not sims:
        return 0.0, 1.0
    low, high = min(sims), max(sims)
    if high - low < 1e-9:  # one candidate, or all alike: each is the best the leg found
        return high - 1.0, 1.0
    return low, high - low


def _score_fusion(entry: dict[str, Any], semantic_floor: float, semantic_span: float,
                  keyword_weight: float = KEYWORD_WEIGHT) -> float:
    keyword = entry.get("keyword_score") or 0.0
    semantic = 0.0
    if "similarity" in entry:
        semantic = min(1.0, max(0.0, (entry["similarity"] - semantic_floor) / semantic_span))
    return (2.0 / RRF_K) * (keyword_weight * keyword + (1 - keyword_weight) * semantic)


def lend_context(scored: list[tuple[float, Any, dict[str, Any]]], candidates: dict[Any, dict[str, Any]],
                 query: SearchQuery, stack_ids: Sequence[int], now: datetime, audience: Audience | None,
                 stats: dict[str, Any], page: dict[Any, Sequence[Any]],
                 constants: RankingConstants = RANKING) -> list[tuple[float, Any, dict[str, Any]]]:
    """Lend the best hits' context (see CONTEXT_SHARE), and read the row of every hit that can still
    make the page - the page before context, or a neighbour - into `page` (by id), in the same
    statement as the neighbours: context only raises scores, so a hit below the page without a
    share of its own stays below it."""
    clock = time.perf_counter()
    seeds = [memory_id for _, memory_id, _ in scored[:constants.context_seeds]]
    params: dict[str, Any] = {"stack_ids": list(stack_ids)}
    where = scope_filters(query, params, audience)
    rows = neighbour_rows(seeds=seeds, where=where, params=params, window=constants.context_window,
                          also=[memory_id for _, memory_id, _ in scored[:query.limit]])
    neighbours = []
    for seed_id, distance, *values in rows:  # in no particular order
        page[values[0]] = values
        if seed_id is not None:
            neighbours.append((seed_id, int(distance), values[0], tuple(values[i] for i in LEG_FIELD_INDEXES)))
    ranked = apply_context(scored, candidates, neighbours, now, constants)
    stats["context_ms"] = round((time.perf_counter() - clock) * 1000, 2)
    return ranked


def apply_context(scored: list[tuple[float, Any, dict[str, Any]]], candidates: dict[Any, dict[str, Any]],
                  neighbours: Iterable[tuple[Any, int, Any, Sequence[Any]]], now: datetime,
                  constants: RankingConstants = RANKING) -> list[tuple[float, Any, dict[str, Any]]]:
    """The ranking after context (§7.5, §7.6): each of the best `context_seeds` hits lends
    context_share · context_decay^(distance - 1) of its combined score to each neighbour,
    `neighbours` = (seed id, distance, neighbour id, its leg row) as memories.search.context reads
    them (in any order). A memory lent by several seeds gets the sum of their shares (a turn
    between two hits), added to its own score but never past the score of the best seed that
    lent to it (its `context_of`), and context never lowers a score: a memory lent context never
    ranks above the hit that lent it. Ties go to the higher own score (before context), so a seed
    stays above the neighbour that reached its score. No database work: the benchmark replays it
    on cached neighbours."""
    seeds = {memory_id: combined for combined, memory_id, _ in scored[:constants.context_seeds]}
    seed_rank = {memory_id: rank for rank, memory_id in enumerate(seeds)}  # best score first
    shares: dict[Any, list[float]] = {}
    lender: dict[Any, Any] = {}
    neighbour: dict[Any, Sequence[Any]] = {}
    for seed_id, distance, memory_id, leg_row in neighbours:
        if seed_id not in seeds or distance > constants.context_window:
            continue
        shares.setdefault(memory_id, []).append(
            constants.context_share * constants.context_decay ** (distance - 1) * seeds[seed_id])
        if memory_id not in lender or seed_rank[seed_id] < seed_rank[lender[memory_id]]:
            lender[memory_id] = seed_id
        neighbour[memory_id] = leg_row
    by_id = {memory_id: (combined, entry) for combined, memory_id, entry in scored}
    own = {memory_id: combined for combined, memory_id, _ in scored}
    for memory_id, lent in shares.items():
        seed_id = lender[memory_id]
        if memory_id in by_id:
            combined, entry = by_id[memory_id]
        else:  # found by neither leg: only its neighbours' shares put it in the ranking
            combined, entry = 0.0, candidates.setdefault(memory_id, {"row": neighbour[memory_id]})
            retention, weight = retention_and_weight(neighbour[memory_id], now)
            entry.update(fused=0.0, retention=retention, weight=weight)
        raised = min(combined + sum(sorted(lent)), seeds[seed_id])  # sorted: the same sum in any order
        if raised > combined:
            entry["boosts"] = {"context": round(raised - combined, 6)}
            entry["context_of"] = seed_id
            by_id[memory_id] = (raised, entry)
    return sorted(((c, i, e) for i, (c, e) in by_id.items()),
                  key=lambda item: (-item[0], -own.get(item[1], 0.0), str(item[1])))


def retention_and_weight(row: Sequence[Any], now: datetime) -> tuple[float, float]:
    """A leg row's retrievability and ranking weight (§7.2)."""
    (_, stability, confidence, created_at, last_reviewed_at, kind, times_accessed, valence, arousal) = row[:SCORE]
    retention = memory_retrievability(DecayState(
        kind=kind, confidence=float(confidence), times_accessed=int(times_accessed),
        emotional_valence=float(valence), emotional_arousal=float(arousal), stability=float(stability),
        last_reviewed_at=last_reviewed_at, created_at=created_at), now)
    return retention, ranking_weight(retention=retention, confidence=float(confidence),
                                     age_days=(now - created_at).total_seconds() / 86400)


def merge_candidates(keyword_rows: Sequence[Sequence[Any]], vector_rows: Sequence[Sequence[Any]],
                     similarities: dict[Any, float]) -> dict[Any, dict[str, Any]]:
    """Both legs' rows as one entry per memory: its row, each leg's rank and score, and its cosine.

    A keyword hit the vector leg did not reach still has a cosine: the vector leg's statement read
    it into `similarities` (by primary key, rows the keyword leg already admitted), so the fusion
    does not count it as 0."""
    candidates: dict[Any, dict[str, Any]] = {}
    # BM25 scaled by the leg's best score, or by the query's weight when the best scores less: the
    # best hit is a full keyword match only when it holds the query's words (QUERY_WEIGHT, §7.6), so
    # one shared common word does not outweigh a memory that answers by meaning.
    # Rows without the weight (the benchmark's ts_rank baseline) are scaled by the best alone.
    best_keyword = max((float(row[SCORE + 1]) for row in keyword_rows), default=0.0)
    best_keyword = max([best_keyword, *(float(row[QUERY_WEIGHT]) for row in keyword_rows
                                        if len(row) > QUERY_WEIGHT)]) or 1.0
    for rank, row in enumerate(keyword_rows):
        entry = candidates.setdefault(row[0], {"row": row})
        entry["keyword_rank"] = rank
        entry["keyword_score"] = min(1.0, float(row[SCORE + 1]) / best_keyword)
    for rank, row in enumerate(vector_rows):
        entry = candidates.setdefault(row[0], {"row": row})
        entry["semantic_rank"] = rank
        entry["semantic_score"] = min(1.0, max(0.0, float(row[SCORE])))
        entry["similarity"] = float(row[SCORE])
    if vector_rows:
        for memory_id, entry in candidates.items():
            if "similarity" not in entry and memory_id in similarities:
                entry["similarity"] = similarities[memory_id]
    return candidates


def rank_candidates(candidates: dict[Any, dict[str, Any]], now: datetime,
                    constants: RankingConstants = RANKING) -> list[tuple[float, Any, dict[str, Any]]]:
    """(combined, id, entry) of every candidate, best first (ties by id): score fusion times the
    ranking weight, on RRF's scale."""
    semantic_floor, semantic_span = _semantic_range([e["similarity"] for e in candidates.values() if "similarity" in e])
    scored = [(weighted(entry, _score_fusion(entry, semantic_floor, semantic_span, constants.keyword_weight), now),
               memory_id, entry)
              for memory_id, entry in candidates.items()]
    return sorted(scored, key=lambda item: (-item[0], str(item[1])))


def weighted(entry: dict[str, Any], fused: float, now: datetime) -> float:
    """Record the entry's fused score, retention and weight, and return its combined score (§7.2)."""
    retention, weight = retention_and_weight(entry["row"], now)
    entry.update(fused=fused, retention=retention, weight=weight)
    return min(1.0, fused * weight / (2.0 / RRF_K))


def page_hits(top: Sequence[tuple[float, Any, dict[str, Any]]], page: dict[Any, Sequence[Any]]) -> list[SearchHit]:
    """The page's hits, each explaining its score. `page`: rows already read (with the context);
    the rest are read here."""
    memories = {memory.pk: memory for memory in memories_from_rows([page[i] for _, i, _ in top if i in page])}
    unread = [memory_id for _, memory_id, _ in top if memory_id not in memories]
    if unread:  # no context (quotes/or/-exclusions): the page is read here
        memories.update(Memory.objects.defer("embedding", "search_vector").in_bulk(unread))
    return [
        SearchHit(
            memory=memories[memory_id],
            combined_score=round(combined, 6),
            fused_score=entry["fused"],
            keyword_score=entry.get("keyword_score"),
            semantic_score=entry.get("semantic_score"),
            keyword_rank=entry.get("keyword_rank"),
            semantic_rank=entry.get("semantic_rank"),
            retention=entry["retention"],
            weight=entry["weight"],
            boosts=entry.get("boosts", {}),
            context_of=entry.get("context_of"),
        )
        for combined, memory_id, entry in top
        if memory_id in memories  # deleted between the legs and this read: skip, don't fail
    ]
