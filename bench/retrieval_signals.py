"""Candidate ranking signals for `bench/retrieval_quality.py --cv --signals` (docs/algorithms.md §7.6).

Each signal wraps the service's replayed ranking (bench/retrieval_cv.replay_scored) with one or two
constants of its own, 0 = off, and is cross-validated like the ranking's constants: a grid of
(keyword weight, context share) x the signal's values, chosen per fold on the other four
conversations. Nothing here is in the service; a signal that pays on every fold (or nearly) moves
into memories.search, and this module keeps only what is still being measured.

* time: "when" questions (and "what year", "how long ago", ...) lift memories whose own words
  carry a time ("yesterday", "last week", a weekday, a month) by `time_boost`;
* speaker: a question naming someone lifts that person's own turns by `speaker_boost` (the
  speaker is the turn's prefix as the bench stores it: "Caroline (1:56 pm on 8 May, 2023): ...");
* prf: pseudo-relevance feedback, the query vector moved towards the mean vector of the top
  `prf_k` hits by `prf_beta`, and the ranking redone with it;
* rerank: feedback within the candidates: the top `prf_k` hits before context move the query
  vector by `rerank_beta` as prf does, but only the candidates the legs found are re-scored (no
  second scan), then ranked again and lent context;
* diversity: the n-th hit of the same session on the page counts (1 - `diversity`)^(n-1);
* adaptive: the keyword weight scaled by how peaked each leg's top scores are.

(below_seed - a memory lent context never ranks above the hit that lent it - was measured here and
is now the service's context, memories.search.fusion.apply_context.)
"""

from __future__ import annotations

if __name__ == "__main__":  # a part of retrieval_quality.py --cv --signals, not a benchmark of its own
    print("bench/retrieval_signals.py: run bench/retrieval_quality.py --cv --signals")
    raise SystemExit(0)

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from bench import retrieval_cv as cv
from bench.harness import print_table
from memories.search.fusion import RankingConstants

TIME_QUESTION = re.compile(r"^\s*when\b|\b(what|which) (year|month|day|date|time)\b|\bhow long\b|\bago\b", re.I)
TIME_WORDS = re.compile(
    r"\b(yesterday|today|tonight|tomorrow|ago|recently|last|next|weekend|"
    r"(mon|tues|wednes|thurs|fri|satur|sun)day|january|february|march|april|june|july|august|september|"
    r"october|november|december|week|weeks|month|months|year|years)\b", re.I)
NAME = re.compile(r"\b[A-Z][a-z]+\b")


@dataclass(frozen=True)
class Signals(RankingConstants):
    time_boost: float = 0.0
    speaker_boost: float = 0.0
    prf_beta: float = 0.0
    prf_k: int = 3
    rerank_beta: float = 0.0
    diversity: float = 0.0
    adaptive: bool = False


def _speaker_and_words(text: str) -> tuple[str, str]:
    head, _, words = text.partition("): ")
    return (head.split(" (", 1)[0], words) if words else ("", text)


_TIMED: dict[Any, bool] = {}


def _timed(conversation: cv.Conversation, memory_id: Any) -> bool:
    found = _TIMED.get(memory_id)
    if found is None:
        found = _TIMED[memory_id] = bool(TIME_WORDS.search(_speaker_and_words(conversation.texts[memory_id])[1]))
    return found


def _boosted(q: cv.Question, conversation: cv.Conversation, constants: Signals, now: datetime,
             vector: np.ndarray | None = None) -> list[tuple[float, Any]]:
    """replay_scored with the boosts applied before context (a boosted hit also lends more)."""
    from memories.search import fusion

    if constants.adaptive:
        constants = _adapted(q, constants)
    if not (constants.time_boost or constants.speaker_boost):
        return cv.replay_scored(q, conversation, constants, now, vector=vector)
    timed = constants.time_boost and TIME_QUESTION.search(q.text)
    speakers = {_speaker_and_words(t)[0] for t in conversation.texts.values()}
    named = set(NAME.findall(q.text)) & speakers if constants.speaker_boost else set()
    if not timed and not named:
        return cv.replay_scored(q, conversation, constants, now, vector=vector)
    original = fusion.rank_candidates

    def rank(candidates: dict[Any, dict[str, Any]], now: datetime, c: Any = fusion.RANKING) -> list[Any]:
        scored = original(candidates, now, c)
        out = []
        for combined, memory_id, entry in scored:
            factor = 1.0
            if timed and _timed(conversation, memory_id):
                factor += constants.time_boost
            if named and _speaker_and_words(conversation.texts[memory_id])[0] in named:
                factor += constants.speaker_boost
            out.append((min(1.0, combined * factor), memory_id, entry))
        return sorted(out, key=lambda item: (-item[0], str(item[1])))

    fusion.rank_candidates = rank  # type: ignore[assignment]
    try:
        return cv.replay_scored(q, conversation, constants, now, vector=vector)
    finally:
        fusion.rank_candidates = original


def _peak(scores: Sequence[float]) -> float:
    """1 - the mean of the top 10 scores scaled to [0, 1] by the best: 0 when all alike, near 1 when one stands out."""
    top = sorted(scores, reverse=True)[:10]
    if len(top) < 2 or top[0] <= top[-1]:
        return 0.5
    return 1 - float(np.mean([(s - top[-1]) / (top[0] - top[-1]) for s in top]))


def _adapted(q: cv.Question, constants: Signals) -> Signals:
    from dataclasses import replace

    from memories.search.query import SCORE

    keyword = _peak([float(r[SCORE + 1]) for r in q.keyword_rows]) if q.keyword_rows else 0.0
    semantic = _peak(list(np.sort(q.cosines)[-10:]))
    w = constants.keyword_weight
    denominator = w * keyword + (1 - w) * semantic
    return replace(constants, keyword_weight=w * keyword / denominator if denominator > 0 else w, adaptive=False)


def reranked(q: cv.Question, conversation: cv.Conversation, constants: Any, now: datetime) -> list[tuple[float, Any]]:
    """Feedback within the candidates (`rerank_beta`): the service's steps with one more ranking
    between rank_candidates and context."""
    from memories.search.fusion import apply_context, merge_candidates, rank_candidates
    from memories.search.query import DEFAULT_MIN_SIMILARITY, over_fetch

    depth = max(over_fetch(cv.LIMIT), constants.fusion_depth)
    order, position = conversation.order, _positions(conversation)
    nearest = np.argsort(-q.cosines, kind="stable")[:depth]
    vector_rows = [(*conversation.leg_rows[order[i]], float(q.cosines[i])) for i in nearest
                   if q.cosines[i] >= DEFAULT_MIN_SIMILARITY]
    keyword_rows = q.keyword_rows[:depth]
    similarities = {row[0]: float(q.cosines[position[row[0]]]) for row in keyword_rows}
    candidates = merge_candidates(keyword_rows, vector_rows, similarities)
    scored = rank_candidates(candidates, now, constants)
    top = [position[memory_id] for _, memory_id, _ in scored[:constants.prf_k]]
    if top:
        units = conversation.matrix[top] / np.linalg.norm(conversation.matrix[top], axis=1, keepdims=True)
        centroid = units.mean(axis=0)
        beta = constants.rerank_beta
        length = np.sqrt(1 + 2 * beta * float(q.cosines[top].mean()) + beta * beta * float(centroid @ centroid))
        for memory_id, entry in candidates.items():
            if "similarity" in entry:
                m = conversation.matrix[position[memory_id]]
                moved = entry["similarity"] + beta * float(m @ centroid) / float(np.linalg.norm(m))
                entry["similarity"] = moved / length
        scored = rank_candidates(candidates, now, constants)
    if q.plain:
        seeds = [memory_id for _, memory_id, _ in scored[:constants.context_seeds]]
        lent = [(seed, distance, other, conversation.leg_rows[other])
                for seed in seeds for distance, other in conversation.neighbours[seed]]
        scored = apply_context(scored, candidates, lent, now, constants)
    return [(combined, memory_id) for combined, memory_id, _ in scored]


def signalled(q: cv.Question, conversation: cv.Conversation, constants: Any, now: datetime) -> list[str]:
    if constants.rerank_beta:
        scored = reranked(q, conversation, constants, now)
    else:
        scored = _boosted(q, conversation, constants, now)
    if constants.prf_beta:
        # The query vector q moved to q + beta * c (c: the mean unit vector of the top hits). The
        # question's cosines are m.q/|m|; the moved query's follow from them and m.c, and
        # |q + beta c|^2 = 1 + 2 beta q.c + beta^2 |c|^2 with q.c = the top hits' mean cosine.
        position = _positions(conversation)
        top = [position[i] for _, i in scored[:constants.prf_k]]
        units = conversation.matrix[top] / np.linalg.norm(conversation.matrix[top], axis=1, keepdims=True)
        centroid = units.mean(axis=0)
        beta = constants.prf_beta
        norms = np.linalg.norm(conversation.matrix, axis=1)
        moved = q.cosines + beta * (conversation.matrix @ centroid) / norms
        length = np.sqrt(1 + 2 * beta * float(q.cosines[top].mean()) + beta * beta * float(centroid @ centroid))
        scored = _boosted(q, conversation, constants, now, vector=moved / length)
    if constants.diversity:
        seen: dict[str, int] = {}
        rescored = []
        for combined, memory_id in scored[:30]:
            session = conversation.record_ids[memory_id].split(":")[0]
            rescored.append((combined * (1 - constants.diversity) ** seen.get(session, 0), memory_id))
            seen[session] = seen.get(session, 0) + 1
        scored = sorted(rescored, key=lambda item: (-item[0], str(item[1])))
    return [conversation.record_ids[i] for _, i in scored[:cv.LIMIT]]


_POSITIONS: dict[int, dict[Any, int]] = {}


def _positions(conversation: cv.Conversation) -> dict[Any, int]:
    found = _POSITIONS.get(id(conversation))
    if found is None:
        found = _POSITIONS[id(conversation)] = {memory_id: i for i, memory_id in enumerate(conversation.order)}
    return found


BASE_GRID = cv.SMALL_GRID
SIGNAL_GRIDS: dict[str, dict[str, tuple[Any, ...]]] = {
    "time": {"time_boost": (0.0, 0.1, 0.2, 0.4)},
    "speaker": {"speaker_boost": (0.0, 0.05, 0.1, 0.2)},
    "prf": {"prf_beta": (0.0, 0.25, 0.5, 1.0)},
    "rerank": {"rerank_beta": (0.0, 0.25, 0.5, 1.0)},
    "diversity": {"diversity": (0.0, 0.1, 0.2, 0.4)},
    "adaptive": {"adaptive": (False, True)},
}


def run(questions: Sequence[cv.Question], conversations: Sequence[cv.Conversation], names: Sequence[str],
        now: datetime, log: Callable[[str], None], only: Sequence[str] = ()) -> None:
    """Cross-validate each signal (with BASE_GRID, each point judged by its plateau) against the
    same grid without it."""
    fold_of = np.array([q.conversation for q in questions])
    folds = sorted(set(fold_of.tolist()))
    results = {}
    for name, grid in [("none", {}), *((n, g) for n, g in SIGNAL_GRIDS.items() if not only or n in only)]:
        points = cv.grid_points(Signals(), {**BASE_GRID, **grid})
        log(f"signal {name}: {len(points)} points")
        scores = cv.score_grid(questions, conversations, points, now, ranker=signalled)
        plateau = cv.grid_neighbours(points, {**BASE_GRID, **grid})
        results[name] = (cv.cross_validate(scores, questions, scores[0], plateau=plateau), points, grid)
    rows = []
    for name, (result, points, grid) in results.items():
        per_fold = [result.after[fold_of == f].mean(axis=0) for f in folds]
        row: dict[str, Any] = {"signal": name}
        for fold, values in zip(folds, per_fold, strict=True):
            row[f"R@10 {names[fold]}"] = f"{values[1]:.3f}"
        mean = np.mean(per_fold, axis=0)
        row.update({"mean R@5": f"{mean[0]:.3f}", "R@10": f"{mean[1]:.3f}", "MRR": f"{mean[2]:.3f}",
                    "chosen": "; ".join(" ".join(f"{getattr(points[p], k)}" for k in grid) for p in result.chosen)})
        rows.append(row)
    print_table("signals, each cross-validated with keyword_weight x context_share (chosen: the signal's value "
                "per fold)", rows)
    cats = np.array([q.category for q in questions])
    cat_rows = []
    for name, (result, _, _) in results.items():
        row = {"signal": name}
        for cat, label in cv.CATEGORIES.items():
            row[f"{cat} {label}"] = f"{result.after[cats == cat, 1].mean():.3f}"
        cat_rows.append(row)
    print_table("signals: cross-validated R@10 per category", cat_rows)
