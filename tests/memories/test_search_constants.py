"""The ranking's constants as one value (docs/algorithms.md §7.6): the service ranks with RANKING,
and the benchmark's cross-validation passes other RankingConstants to the same fusion code
(bench/retrieval_cv.py), so what it measures is the served ranking."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from memories.search.fusion import RANKING, apply_context, rank_candidates
from memories.search.query import SCORE


def leg_row(memory_id: str, score: float) -> tuple[Any, ...]:
    created = timezone.now() - timedelta(hours=1)
    # LEG_COLUMNS: id, stability, confidence, created_at, last_reviewed_at, kind, times_accessed, valence, arousal
    row: tuple[Any, ...] = (memory_id, 1.0, 0.8, created, None, "note", 0, 0.0, 0.0)
    assert len(row) == SCORE
    return (*row, score)


def candidates() -> dict[str, dict[str, Any]]:
    return {"a": {"row": leg_row("a", 0.9), "keyword_score": 1.0, "keyword_rank": 0, "similarity": 0.9},
            "b": {"row": leg_row("b", 0.5), "keyword_score": 0.2, "keyword_rank": 1, "similarity": 0.5}}


def test_the_served_constants_are_the_documented_ones() -> None:
    assert (RANKING.keyword_weight, RANKING.context_share, RANKING.context_window, RANKING.context_decay,
            RANKING.context_seeds, RANKING.fusion_depth) == (0.5, 0.6, 2, 0.5, 5, 30)


def test_a_constants_value_changes_the_fusion_and_the_share_lent_and_nothing_else() -> None:
    now = timezone.now()
    served = rank_candidates(candidates(), now)
    keyword_heavy = rank_candidates(candidates(), now, replace(RANKING, keyword_weight=0.9))
    assert [i for _, i, _ in served] == [i for _, i, _ in keyword_heavy] == ["a", "b"]
    # b's cosine is the lowest of the candidates (min-max scaled to 0): only its keyword score counts.
    assert keyword_heavy[1][0] == pytest.approx(served[1][0] * 0.9 / RANKING.keyword_weight)

    neighbours = [("a", 1, "n1", leg_row("n1", 0.0)[:SCORE]), ("a", 2, "n2", leg_row("n2", 0.0)[:SCORE]),
                  ("a", 3, "n3", leg_row("n3", 0.0)[:SCORE])]
    for constants in (RANKING, replace(RANKING, context_share=0.5, context_decay=0.75)):
        scored = rank_candidates(candidates(), now, constants)
        top = scored[0][0]
        lent = {i: c for c, i, _ in apply_context(scored, candidates(), neighbours, now, constants)}
        assert lent["n1"] == pytest.approx(constants.context_share * top, abs=1e-9)
        assert lent["n2"] == pytest.approx(constants.context_share * constants.context_decay * top, abs=1e-9)
        assert "n3" not in lent  # beyond the window: never lent, whatever the statement returned


def test_shares_add_up_but_a_lent_memory_never_outranks_its_lender() -> None:
    """§7.6: a memory lent by several hits gets the sum of their shares, capped at the best lender's
    score (before context); a tie goes to the higher own score; context never lowers a score."""
    now = timezone.now()
    constants = replace(RANKING, context_share=0.6, context_decay=0.5)
    scored: list[tuple[float, Any, dict[str, Any]]] = [(0.9, "a", {}), (0.8, "b", {}), (0.2, "c", {})]
    neighbours = [("a", 1, "m", leg_row("m", 0.0)[:SCORE]), ("b", 1, "m", leg_row("m", 0.0)[:SCORE]),
                  ("a", 1, "c", leg_row("c", 0.0)[:SCORE]), ("b", 2, "x", leg_row("x", 0.0)[:SCORE]),
                  ("b", 1, "a", leg_row("a", 0.0)[:SCORE])]
    ranked = apply_context(scored, {}, neighbours, now, constants)
    score = {i: c for c, i, _ in ranked}
    entry = {i: e for _, i, e in ranked}
    # m sits between a and b: 0.6·0.9 + 0.6·0.8 = 1.02, capped at a's 0.9, and ranked below a.
    assert score["m"] == pytest.approx(0.9) and entry["m"]["context_of"] == "a"
    assert [i for _, i, _ in ranked].index("a") < [i for _, i, _ in ranked].index("m")
    assert entry["m"]["boosts"] == {"context": pytest.approx(0.9)}
    # A hit lent to keeps its own score plus the share, below its lender; two turns away, half the share.
    assert score["c"] == pytest.approx(min(0.2 + 0.6 * 0.9, 0.9))
    assert score["x"] == pytest.approx(0.6 * 0.5 * 0.8)
    # a, lent by the weaker b, keeps its own score: no boost, no lender.
    assert score["a"] == 0.9 and "boosts" not in entry["a"] and "context_of" not in entry["a"]
    # The order does not depend on the order the neighbours arrive in.
    again = apply_context(scored, {}, list(reversed(neighbours)), now, constants)
    assert [(c, i) for c, i, _ in again] == [(c, i) for c, i, _ in ranked]
