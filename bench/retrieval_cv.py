"""Leave-one-conversation-out cross-validation of the ranking's constants (docs/algorithms.md §7.6),
for `bench/retrieval_quality.py --cv`.

Each question's legs are read once from the service: its keyword leg (memories.search.keyword_leg,
BM25 in SQL, `MAX_DEPTH` rows), its query vector (the service's embedder) against the stack's
stored vectors (numpy: the stacks are far below a per-stack HNSW index, so the service ranks them
exactly too), and the turns' neighbours in the stack (same kind, within
memories.search.context.CONTEXT_MAX_GAP, in `created_at` order). Every grid point is then re-fused
in Python by the service's own fusion (memories.search.fusion: merge_candidates, rank_candidates,
apply_context) with a `RankingConstants` value - no query per grid point. `--cv` also checks that
the replay of the served constants gives the service's own top 10 (the `agreement` line).

Cross-validation: for each conversation (a fold), the constants are chosen on the other four (the
grid point with the best mean R@10 over their questions, ties by R@5, then MRR, each point judged
by its plateau) and scored on the held-out one. "before" is the ranking served before §7.6's
change - v2's constants (before_constants) with v2's keyword scale and context (`replay_before`,
kept here for the comparison) - on every fold; "after" the constants each fold chose without
seeing its own conversation.
"""

from __future__ import annotations

import hashlib
import itertools
import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

MAX_DEPTH = 60  # keyword rows read per question: the deepest FUSION_DEPTH of any grid
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
# The keyword weight's grid stops at 0.5: above it a note sharing a name with the question outranks
# the note that answers it by meaning in a small store of notes (docs/algorithms.md §7.6).
GRID: dict[str, tuple[Any, ...]] = {
    "keyword_weight": (0.3, 0.4, 0.5),
    "context_share": (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
    "context_decay": (0.5, 0.75),
    "context_seeds": (5, 10),
    "fusion_depth": (30, 50),
}
# The constants tuned by default (--grid small): the two the ranking is most sensitive to; the
# others keep their values (docs/algorithms.md §7.6 says why fewer constants).
SMALL_GRID: dict[str, tuple[Any, ...]] = {
    "keyword_weight": (0.3, 0.4, 0.5),
    "context_share": (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
}
LEGS_VERSION = "bm25 + query weight"  # in the legs cache's key: rows cached by older code are read again
LIMIT = 10


def before_constants() -> Any:
    """Ranking v2's constants as chosen on the whole dev split (docs/algorithms.md §7.5), the
    "before" of every cross-validation table (with `replay_before`), whatever the service ranks with now."""
    from memories.search.fusion import RankingConstants

    return RankingConstants(keyword_weight=0.4, fusion_depth=30, context_seeds=5, context_share=0.3,
                            context_window=2, context_decay=0.5)


@dataclass
class Conversation:
    name: str
    record_ids: dict[Any, str]  # memory id -> record id
    leg_rows: dict[Any, tuple[Any, ...]]  # memory id -> its LEG_COLUMNS
    order: list[Any]  # memory ids by created_at
    matrix: np.ndarray  # their vectors, in `order`
    texts: dict[Any, str]
    neighbours: dict[Any, list[tuple[int, Any]]]  # memory id -> (distance, neighbour id)


@dataclass
class Question:
    conversation: int
    category: int
    text: str
    evidence: set[str]
    plain: bool
    keyword_rows: list[tuple[Any, ...]]
    cosines: np.ndarray  # against Conversation.order
    nearest: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def load_conversation(stack: Any, window: int) -> Conversation:
    from memories.models import Memory
    from memories.search.context import CONTEXT_MAX_GAP
    from memories.search.query import LEG_COLUMNS

    columns = [c.removeprefix("m.") for c in LEG_COLUMNS.split(", ")]
    rows = list(Memory.objects.filter(stack=stack, deleted_at__isnull=True, forgotten_at__isnull=True)
                .order_by("created_at", "id").values_list(*columns, "record_id", "embedding", "text"))
    order = [row[0] for row in rows]
    neighbours: dict[Any, list[tuple[int, Any]]] = {memory_id: [] for memory_id in order}
    for i, row in enumerate(rows):
        for step in (-1, 1):
            for distance in range(1, window + 1):
                j = i + step * distance
                if not 0 <= j < len(rows):
                    break
                other = rows[j]
                if other[5] == row[5] and abs(other[3] - row[3]) <= CONTEXT_MAX_GAP:
                    neighbours[row[0]].append((distance, other[0]))
    return Conversation(
        name=stack.slug, record_ids={row[0]: row[9] for row in rows},
        leg_rows={row[0]: tuple(row[:9]) for row in rows}, order=order,
        matrix=np.stack([np.asarray(row[10], dtype=np.float32) for row in rows]),
        texts={row[0]: row[11] for row in rows}, neighbours=neighbours)


def read_legs(conversations: Sequence[tuple[Any, Conversation]], questions: Sequence[dict[str, Any]],
              cache_path: Path | None) -> list[Question]:
    """Each question's keyword rows and cosines, from the service (cached in `cache_path`, keyed by
    the questions, the stacks' rows and the embedding model)."""
    from memories.search.embeddings import embed_query, get_embedder
    from memories.search.keyword_leg import SCOPE_MEMORIES_SQL, KeywordInputs, keyword_leg, query_lexemes
    from memories.search.query import SearchQuery, is_plain

    key = hashlib.sha256(repr((LEGS_VERSION, get_embedder().model_id,
                               [sorted(map(str, c.order)) for _, c in conversations],
                               [(q["conversation"], q["question"]) for q in questions])).encode()).hexdigest()
    if cache_path is not None and cache_path.exists():
        cached = pickle.loads(cache_path.read_bytes())  # noqa: S301 - our own file, written below
        if cached.get("key") == key:
            return list(cached["questions"])
    from django.db import connection

    result = []
    for q in questions:
        stack, conversation = conversations[q["conversation"]]
        with connection.cursor() as cursor:
            cursor.execute(SCOPE_MEMORIES_SQL, [[stack.pk]])
            scope_rows = int(cursor.fetchone()[0])
        inputs = KeywordInputs(lexemes=query_lexemes(q["question"]), scope_rows=scope_rows)
        rows = keyword_leg(SearchQuery(text=q["question"], limit=LIMIT), [stack.pk], MAX_DEPTH, None, inputs)
        vector = np.asarray(embed_query(q["question"]), dtype=np.float32)
        cosines = conversation.matrix @ vector / (np.linalg.norm(conversation.matrix, axis=1) * np.linalg.norm(vector))
        result.append(Question(conversation=q["conversation"], category=q["category"], text=q["question"],
                               evidence=q["evidence"], plain=is_plain(q["question"]),
                               keyword_rows=[tuple(r) for r in rows], cosines=cosines.astype(np.float64)))
    if cache_path is not None:
        cache_path.write_bytes(pickle.dumps({"key": key, "questions": result}))
    return result


# A ranking: (question, its conversation, constants, now) -> the top record ids. `replay` is the
# service's; bench/retrieval_signals.py adds candidate signals around it.
Ranker = Callable[[Question, Conversation, Any, datetime], list[str]]


def replay(q: Question, conversation: Conversation, constants: Any, now: datetime) -> list[str]:
    """The service's ranking of `q` with `constants` (memories.search.hybrid._search's steps)."""
    return [conversation.record_ids[i] for _, i in replay_scored(q, conversation, constants, now)[:LIMIT]]


def replay_before(q: Question, conversation: Conversation, constants: Any, now: datetime) -> list[str]:
    """The ranking served before docs/algorithms.md §7.6's change: BM25 scaled by the leg's best
    score alone, and a memory lent context by several seeds keeping the larger share, added to its
    own score (capped at 1). The "before" of the cross-validation tables."""
    return [conversation.record_ids[i] for _, i in replay_scored(q, conversation, constants, now, before=True)[:LIMIT]]


def _context_before(scored: list[Any], candidates: dict[Any, dict[str, Any]], neighbours: Sequence[Any],
                    now: datetime, constants: Any) -> list[Any]:
    seeds = {memory_id: combined for combined, memory_id, _ in scored[:constants.context_seeds]}
    seed_rank = {memory_id: rank for rank, memory_id in enumerate(seeds)}
    lent: dict[Any, tuple[float, Any]] = {}
    for seed_id, distance, memory_id, _ in neighbours:
        if seed_id not in seeds or distance > constants.context_window:
            continue
        share = constants.context_share * constants.context_decay ** (distance - 1) * seeds[seed_id]
        best, best_seed = lent.get(memory_id, (0.0, None))
        if share > best or (share == best and best_seed is not None and seed_rank[seed_id] < seed_rank[best_seed]):
            lent[memory_id] = (share, seed_id)
    by_id = {memory_id: (combined, entry) for combined, memory_id, entry in scored}
    for memory_id, (share, _) in lent.items():
        combined, entry = by_id.get(memory_id, (0.0, {}))
        by_id[memory_id] = (min(1.0, combined + share), entry)
    return sorted(((c, i, e) for i, (c, e) in by_id.items()), key=lambda item: (-item[0], str(item[1])))


def replay_scored(q: Question, conversation: Conversation, constants: Any, now: datetime,
                  *, vector: np.ndarray | None = None, before: bool = False) -> list[tuple[float, Any]]:
    """(combined, memory id) best first; `vector`: other cosines than the question's (feedback);
    `before`: the ranking served before §7.6's change (`replay_before`)."""
    from memories.search.fusion import apply_context, merge_candidates, rank_candidates
    from memories.search.query import DEFAULT_MIN_SIMILARITY, SCORE, over_fetch

    depth = max(over_fetch(LIMIT), constants.fusion_depth)
    cosines = q.cosines if vector is None else vector
    if vector is None and len(q.nearest) < depth:
        q.nearest = np.argsort(-cosines, kind="stable")[:MAX_DEPTH]
    nearest = q.nearest if vector is None else np.argsort(-cosines, kind="stable")[:depth]
    order = conversation.order
    vector_rows = [(*conversation.leg_rows[order[i]], float(cosines[i])) for i in nearest[:depth]
                   if cosines[i] >= DEFAULT_MIN_SIMILARITY]
    keyword_rows = q.keyword_rows[:depth]
    position = _positions(conversation)
    similarities = {row[0]: float(cosines[position[row[0]]]) for row in keyword_rows}
    if before:  # the leg's rows without the query's weight: BM25 scaled by the best alone
        keyword_rows = [row[:SCORE + 2] for row in keyword_rows]
    candidates = merge_candidates(keyword_rows, vector_rows, similarities)
    scored = rank_candidates(candidates, now, constants)
    if q.plain:
        seeds = [memory_id for _, memory_id, _ in scored[:constants.context_seeds]]
        lent = [(seed, distance, other, conversation.leg_rows[other])
                for seed in seeds for distance, other in conversation.neighbours[seed]]
        scored = (_context_before if before else apply_context)(scored, candidates, lent, now, constants)
    return [(combined, memory_id) for combined, memory_id, _ in scored]


_POSITIONS: dict[int, dict[Any, int]] = {}


def _positions(conversation: Conversation) -> dict[Any, int]:
    found = _POSITIONS.get(id(conversation))
    if found is None:
        found = _POSITIONS[id(conversation)] = {memory_id: i for i, memory_id in enumerate(conversation.order)}
    return found


def metrics(found: list[str], evidence: set[str]) -> tuple[float, float, float]:
    r5 = len(set(found[:5]) & evidence) / len(evidence)
    r10 = len(set(found[:10]) & evidence) / len(evidence)
    mrr = next((1.0 / (i + 1) for i, rid in enumerate(found[:10]) if rid in evidence), 0.0)
    return r5, r10, mrr


def grid_points(base: Any, grid: Mapping[str, Sequence[Any]]) -> list[Any]:
    names = list(grid)
    return [replace(base, **dict(zip(names, values, strict=True))) for values in itertools.product(*grid.values())]


def score_grid(questions: Sequence[Question], conversations: Sequence[Conversation], points: Sequence[Any],
               now: datetime, ranker: Ranker = replay, log: Callable[[str], None] | None = None) -> np.ndarray:
    """(point, question, metric) for every grid point: R@5, R@10, MRR."""
    out = np.zeros((len(points), len(questions), 3))
    for p, constants in enumerate(points):
        for j, q in enumerate(questions):
            out[p, j] = metrics(ranker(q, conversations[q.conversation], constants, now), q.evidence)
        if log is not None and (p + 1) % 20 == 0:
            log(f"grid {p + 1}/{len(points)}")
    return out


@dataclass
class CrossValidation:
    folds: list[int]  # conversation index per fold
    chosen: list[int]  # grid point chosen per fold (on the other folds)
    after: np.ndarray  # (question, metric): each question scored with its fold's chosen point
    before: np.ndarray  # (question, metric): the ranking served before (replay_before)


def grid_neighbours(points: Sequence[Any], grid: Mapping[str, Sequence[Any]]) -> list[list[int]]:
    """Each grid point's plateau: itself and the points one step away along one constant."""
    names = list(grid)
    index = {tuple(getattr(p, k) for k in names): i for i, p in enumerate(points)}
    out = []
    for p in points:
        key = [getattr(p, k) for k in names]
        near = [index[tuple(key)]]
        for axis, name in enumerate(names):
            values = list(grid[name])
            at = values.index(key[axis])
            for step in (-1, 1):
                if 0 <= at + step < len(values):
                    other = tuple(values[at + step] if a == axis else v for a, v in enumerate(key))
                    if other in index:
                        near.append(index[other])
        out.append(near)
    return out


def cross_validate(scores: np.ndarray, questions: Sequence[Question], before: np.ndarray, *,
                   train_on_all: bool = False, plateau: list[list[int]] | None = None) -> CrossValidation:
    """Leave one conversation out: per fold, the grid point with the best mean R@10 (then R@5, MRR)
    on the other conversations' questions; the held-out questions scored with it. `train_on_all`:
    one "fold" trained on every question (what the service would ship), nothing held out.
    `plateau` (grid_neighbours): a point is judged by the mean of its plateau's figures, so a
    flat stretch beats a lone peak. `before`: (question, metric) of the ranking compared with."""
    folds = sorted({q.conversation for q in questions})
    if train_on_all:
        folds = [-1]
    fold_of = np.array([q.conversation for q in questions])
    after = np.zeros((len(questions), 3))
    chosen = []
    for fold in folds:
        train = fold_of != fold
        means = scores[:, train, :].mean(axis=1)  # (point, metric)
        if plateau is not None:
            means = np.array([means[near].mean(axis=0) for near in plateau])
        best = max(range(len(means)), key=lambda p: (round(means[p, 1], 9), round(means[p, 0], 9),
                                                      round(means[p, 2], 9), -p))
        chosen.append(best)
        after[~train] = scores[best, ~train]
    return CrossValidation(folds=folds, chosen=chosen, after=after, before=before)


def fold_table(cv: CrossValidation, questions: Sequence[Question], names: Sequence[str], points: Sequence[Any],
               grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    fold_of = np.array([q.conversation for q in questions])
    rows = []
    for fold, point in zip(cv.folds, cv.chosen, strict=True):
        held = fold_of == fold
        b, a = cv.before[held].mean(axis=0), cv.after[held].mean(axis=0)
        rows.append({"fold": names[fold], "questions": int(held.sum()),
                     "before R@5": f"{b[0]:.3f}", "R@10": f"{b[1]:.3f}", "MRR": f"{b[2]:.3f}",
                     "after R@5": f"{a[0]:.3f}", "R@10 ": f"{a[1]:.3f}", "MRR ": f"{a[2]:.3f}",
                     "chosen": " ".join(f"{k}={getattr(points[point], k)}" for k in grid)})
    b = np.mean([cv.before[fold_of == f].mean(axis=0) for f in cv.folds], axis=0)
    a = np.mean([cv.after[fold_of == f].mean(axis=0) for f in cv.folds], axis=0)
    rows.append({"fold": "mean of folds", "questions": len(questions),
                 "before R@5": f"{b[0]:.3f}", "R@10": f"{b[1]:.3f}", "MRR": f"{b[2]:.3f}",
                 "after R@5": f"{a[0]:.3f}", "R@10 ": f"{a[1]:.3f}", "MRR ": f"{a[2]:.3f}", "chosen": ""})
    return rows


def category_table(cv: CrossValidation, questions: Sequence[Question]) -> list[dict[str, Any]]:
    cats = np.array([q.category for q in questions])
    rows = []
    for cat, name in [*CATEGORIES.items(), (0, "all")]:
        held = cats == cat if cat else np.ones(len(questions), dtype=bool)
        if not held.any():
            continue
        b, a = cv.before[held].mean(axis=0), cv.after[held].mean(axis=0)
        rows.append({"category": f"{cat} {name}" if cat else name, "questions": int(held.sum()),
                     "before R@5": f"{b[0]:.3f}", "R@10": f"{b[1]:.3f}", "MRR": f"{b[2]:.3f}",
                     "after R@5": f"{a[0]:.3f}", "R@10 ": f"{a[1]:.3f}", "MRR ": f"{a[2]:.3f}"})
    return rows


def constant_curves(scores: np.ndarray, questions: Sequence[Question], points: Sequence[Any], base: Any,
                    grid: Mapping[str, Sequence[Any]], names: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Per constant, its curve on each fold's training conversations with the others at `base`'s
    values (mean R@10 per value; * marks that fold's optimum), and its value at each fold's joint
    optimum is in the fold table's `chosen`."""
    fold_of = np.array([q.conversation for q in questions])
    index = {tuple(getattr(p, k) for k in grid): i for i, p in enumerate(points)}
    tables: dict[str, list[dict[str, Any]]] = {}
    for name, values in grid.items():
        rows = tables.setdefault(name, [])
        for fold in sorted(set(fold_of.tolist())):
            train = fold_of != fold
            curve = []
            for value in values:
                key = tuple(value if k == name else getattr(base, k) for k in grid)
                curve.append(scores[index[key], train, 1].mean() if key in index else float("nan"))
            best = int(np.nanargmax(curve))
            rows.append({"train without": names[fold],
                         **{f"{name}={v}": f"{c:.3f}{'*' if i == best else ''}" for i, (v, c) in
                            enumerate(zip(values, curve, strict=True))}})
    return tables


def agreement(questions: Iterable[Question], served: dict[str, list[str]], conversations: Sequence[Conversation],
              constants: Any, now: datetime) -> tuple[int, int]:
    """How many questions' replayed top 10 (the served constants) equal the service's, of how many."""
    same = total = 0
    for q in questions:
        key = f"{q.conversation}:{q.text}"
        if key in served:
            total += 1
            same += replay(q, conversations[q.conversation], constants, now) == served[key]
    return same, total
