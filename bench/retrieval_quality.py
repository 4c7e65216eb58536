"""Retrieval quality on LoCoMo (dev): MemoryHub's hybrid search - today's ranking and the previous
one (v1, kept for this comparison in bench/search_rankings.py) - next to plain BM25 and plain
vector search, all computed in the same run over the same texts.

Each conversation goes into its own stack, one memory per dialogue turn (written through the real
ingest service, embedded by the real embedding job with all-MiniLM-L6-v2). A turn is stored as a
conversation logger would: `created_at` 30 s after the previous turn, a session one hour after the
previous session (kept within the last day, so the decay weighting of §7.2 hardly differs between
turns). Every question with evidence is asked; evidence recall@k = the share of a question's
evidence turns found in the top k, averaged over questions; MRR = 1 / rank of the first evidence
turn (0 when none is in the top 10). Categories as LoCoMo numbers them: 1 multi-hop, 2 temporal,
3 open-domain, 4 single-hop, 5 adversarial (the question asks about something the conversation
does not say, but its evidence turns are the ones it is about). Every category is asked and has a
table of its own; the totals are printed for all five and for categories 1-4 alone (the 759
questions of the runs before the adversarial ones were asked, docs/algorithms.md §7.5).

Baselines:
* BM25 - Okapi BM25 (k1 = 1.2, b = 0.75) over lowercase word tokens, in Python;
* vector - exact cosine ranking of the very same MiniLM vectors MemoryHub stored, in numpy
  (its latency includes embedding the question).

    .venv/bin/python bench/retrieval_quality.py --data ../shared/data/locomo-dev.json \
        [--limit-questions N] [--data-dir DIR] [--ablation] [--cv [--signals]]

`--data-dir` keeps the embedded database there and reuses its stacks on the next run (embedding
~6k turns with MiniLM is most of a run). `--ablation` adds one row per ranking change on its own.

`--cv`: leave-one-conversation-out cross-validation of the ranking's constants over every
question with evidence, adversarial ones (category 5) included (bench/retrieval_cv.py,
docs/algorithms.md §7.6): R@5, R@10, MRR per fold and category for today's constants and the
constants each fold chose on the other four, and each constant's curve per fold. Each question's
legs are read once (cached in the data dir) and every grid point re-fused in Python. `--signals`
adds the candidate ranking signals of bench/retrieval_signals.py, each cross-validated the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_environment, log, print_table

DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "locomo-dev.json"
TOKEN = re.compile(r"[a-z0-9]+")
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
FIRST_FOUR = -1  # the totals key of categories 1-4 (0: all questions)
TURN_SPACING = timedelta(seconds=30)
SESSION_SPACING = timedelta(hours=1)


def turn_text(turn: dict[str, Any], date_time: str) -> str:
    text = f"{turn['speaker']} ({date_time}): {turn['text']}"
    if turn.get("image_caption"):
        text += f" [shares a photo: {turn['image_caption']}]"
    return text


class BM25:
    def __init__(self, docs: list[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.tokens = [TOKEN.findall(d.lower()) for d in docs]
        self.lengths = np.array([len(t) for t in self.tokens], dtype=np.float64)
        self.avg = float(self.lengths.mean()) if len(docs) else 0.0
        self.tf = [Counter(t) for t in self.tokens]
        df: Counter[str] = Counter()
        for t in self.tokens:
            df.update(set(t))
        n = len(docs)
        self.idf = {term: math.log(1 + (n - f + 0.5) / (f + 0.5)) for term, f in df.items()}

    def top(self, query: str, k: int) -> list[int]:
        scores = np.zeros(len(self.tokens))
        for term in set(TOKEN.findall(query.lower())):
            idf = self.idf.get(term)
            if idf is None:
                continue
            for i, tf in enumerate(self.tf):
                f = tf.get(term)
                if f:
                    norm = self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg)
                    scores[i] += idf * f * (self.k1 + 1) / (f + norm)
        order = np.argsort(-scores, kind="stable")
        return [int(i) for i in order[:k] if scores[i] > 0]


def recall(found: list[str], evidence: set[str], k: int) -> float:
    return len(set(found[:k]) & evidence) / len(evidence)


def reciprocal_rank(found: list[str], evidence: set[str]) -> float:
    return next((1.0 / (i + 1) for i, rid in enumerate(found[:10]) if rid in evidence), 0.0)


def load_conversation(conversation: dict[str, Any], org: Any, start: Any) -> tuple[Any, list[str], list[str]]:
    """The conversation's stack (created and embedded, or reused from --data-dir), its turn texts and ids."""
    from memories.models import Memory
    from memories.search.embedding_jobs import memories_embed
    from memories.services import memory_batch_create
    from stacks.models import Stack

    items, texts, ids = [], [], []
    clock = start
    for session in conversation["sessions"]:
        clock += SESSION_SPACING
        for turn in session["turns"]:
            clock += TURN_SPACING
            text = turn_text(turn, session.get("date_time", ""))
            items.append({"kind": "note", "record_id": turn["dia_id"], "content": text,
                          "created_at": clock.isoformat()})
            texts.append(text)
            ids.append(turn["dia_id"])
    from memories.search.embeddings import get_embedder

    stack, created = Stack.objects.get_or_create(organization=org, slug=f"conv-{conversation['id']}")
    embedded = Memory.objects.filter(stack=stack, embedding__isnull=False,
                                     embedding_model=get_embedder().model_id).count()
    if created or embedded != len(items):
        Memory.objects.filter(stack=stack).delete()
        for begin in range(0, len(items), 500):
            try:
                memory_batch_create(stack=stack, items=items[begin:begin + 500], source="bench")
            except Exception as exc:
                raise SystemExit(f"ingest refused a batch: {getattr(exc, 'fields', exc)}") from exc
        memories_embed(ids=list(Memory.objects.filter(stack=stack).values_list("pk", flat=True)))
    return stack, texts, ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--limit-questions", type=int, default=0, help="per conversation; 0 = all")
    parser.add_argument("--data-dir", type=Path, default=None, help="keep (and reuse) the database here")
    parser.add_argument("--ablation", action="store_true", help="also each ranking change on its own")
    parser.add_argument("--cv", action="store_true", help="leave-one-conversation-out cross-validation")
    parser.add_argument("--signals", nargs="?", const="all", default="",
                        help="with --cv: also the candidate signals (all, or a comma-separated list)")
    parser.add_argument("--grid", choices=("small", "full"), default="small",
                        help="with --cv: the tuned constants (small: keyword weight and context share)")
    parser.add_argument("--select", choices=("plateau", "peak"), default="plateau",
                        help="with --cv: judge a grid point by its plateau (it and its neighbours) or alone")
    args = parser.parse_args()
    dataset = json.loads(args.data.read_text())
    os.environ["EMBEDDING_PROVIDER"] = "minilm"
    if args.cv:
        cross_validation(args, dataset)
        return

    with bench_environment("retrieval", data_dir=args.data_dir) as _env:
        from django.db import connection
        from django.utils import timezone

        from accounts.models import Organization
        from bench.search_rankings import ABLATIONS, search_ranked
        from memories.models import Memory
        from memories.search.embeddings import embed_query, query_cache
        from memories.search.hybrid import search_memories
        from memories.search.query import SearchQuery

        org, _ = Organization.objects.get_or_create(slug="locomo", defaults={"name": "LoCoMo", "tier": "unlimited"})
        # None: the service's own search; a name: a ranking of bench/search_rankings.py.
        rankings: dict[str, str | None] = {"MemoryHub hybrid (today)": None, "MemoryHub hybrid v1 (before)": "v1"}
        if args.ablation:
            for name in ABLATIONS:
                rankings[f"ablation: {name}"] = name
        methods = [*rankings, "BM25", "plain vector"]
        scores: dict[tuple[str, int, str], list[float]] = {}  # (method, category, metric) -> per question
        latency: dict[str, list[float]] = {m: [] for m in methods}
        started_load = time.monotonic()
        # A day back, so every turn is in the past and sessions stay an hour apart.
        start = timezone.now() - timedelta(days=1)
        conversations = [(c, *load_conversation(c, org, start)) for c in dataset["conversations"]]
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE memories_memory")
        load_s = time.monotonic() - started_load
        turns_total = sum(len(ids) for *_, ids in conversations)
        search_memories(stack_ids=[conversations[0][1].pk], query=SearchQuery(text="warm up"))
        for conversation, stack, texts, ids in conversations:
            rows = dict(Memory.objects.filter(stack=stack).values_list("record_id", "embedding"))
            matrix = np.stack([np.asarray(rows[i], dtype=np.float32) for i in ids])
            bm25 = BM25(texts)
            questions = [q for q in conversation["qa"] if q.get("evidence")]
            if args.limit_questions:
                questions = questions[: args.limit_questions]
            log(f"conversation {conversation['id']}: {len(ids)} turns, {len(questions)} questions")
            for qa in questions:
                evidence = {e.strip() for e in qa["evidence"] if e.strip() in rows}
                if not evidence:
                    continue
                question = str(qa["question"])
                found: dict[str, list[str]] = {}
                for label, ranking in rankings.items():
                    query_cache.clear()  # each search pays for its own query embedding, as a first ask would
                    began = time.perf_counter()
                    query = SearchQuery(text=question, limit=10)
                    if ranking is None:
                        hits = search_memories(stack_ids=[stack.pk], query=query).hits
                    else:
                        hits = search_ranked(ranking, stack_ids=[stack.pk], query=query).hits
                    latency[label].append((time.perf_counter() - began) * 1000)
                    found[label] = [h.memory.record_id for h in hits]
                began = time.perf_counter()
                found["BM25"] = [ids[i] for i in bm25.top(question, 10)]
                latency["BM25"].append((time.perf_counter() - began) * 1000)
                query_cache.clear()
                began = time.perf_counter()
                found["plain vector"] = [ids[i] for i in np.argsort(-(matrix @ np.asarray(embed_query(question))))[:10]]
                latency["plain vector"].append((time.perf_counter() - began) * 1000)
                category = int(qa.get("category", 0))
                for method in methods:
                    for cat in (category, 0, *((FIRST_FOUR,) if category != 5 else ())):
                        scores.setdefault((method, cat, "R@5"), []).append(recall(found[method], evidence, 5))
                        scores.setdefault((method, cat, "R@10"), []).append(recall(found[method], evidence, 10))
                        scores.setdefault((method, cat, "MRR"), []).append(reciprocal_rank(found[method], evidence))

        def mean(method: str, cat: int, metric: str) -> float:
            values = scores.get((method, cat, metric))
            return float(np.mean(values)) if values else math.nan

        def p(values: list[float], q: float) -> float:
            ordered = sorted(values)
            return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else math.nan

        from memories.search.embeddings import get_embedder

        title = (f"LoCoMo evidence recall ({len(conversations)} conversations, {turns_total:,} turns, "
                 f"embeddings {get_embedder().model_id}, "
                 f"{len(scores.get((methods[0], 0, 'R@5'), []))} questions)")
        print_table(title, [
            {"method": m, "R@5": mean(m, 0, "R@5"), "R@10": mean(m, 0, "R@10"), "MRR": mean(m, 0, "MRR"),
             "p50 ms": p(latency[m], 0.5), "p95 ms": p(latency[m], 0.95)} for m in methods])
        n = len(scores.get((methods[0], FIRST_FOUR, "R@5"), []))
        print_table(f"categories 1-4 ({n} questions; comparable with the runs that skipped category 5)", [
            {"method": m, "R@5": mean(m, FIRST_FOUR, "R@5"), "R@10": mean(m, FIRST_FOUR, "R@10"),
             "MRR": mean(m, FIRST_FOUR, "MRR")} for m in methods])
        for cat, name in CATEGORIES.items():
            n = len(scores.get((methods[0], cat, "R@5"), []))
            print_table(f"category {cat} {name} ({n} questions)", [
                {"method": m, "R@5": mean(m, cat, "R@5"), "R@10": mean(m, cat, "R@10"), "MRR": mean(m, cat, "MRR")}
                for m in methods])
        today, before = methods[0], methods[1]
        print(f"\nload + embed (or reuse) {load_s:.1f}s. Goal (categories 1-4): R@10 >= 0.75 (today "
              f"{mean(today, FIRST_FOUR, 'R@10'):.3f}, before {mean(before, FIRST_FOUR, 'R@10'):.3f}); R@5 >= 0.65 "
              f"(today {mean(today, FIRST_FOUR, 'R@5'):.3f}, before {mean(before, FIRST_FOUR, 'R@5'):.3f}); "
              f"search p95 today / before "
              f"{p(latency[today], 0.95) / p(latency[before], 0.95):.2f}x")


def cross_validation(args: argparse.Namespace, dataset: dict[str, Any]) -> None:
    """`--cv` (bench/retrieval_cv.py has the method)."""
    with bench_environment("retrieval", data_dir=args.data_dir) as env:
        from django.db import connection
        from django.utils import timezone

        from accounts.models import Organization
        from bench import retrieval_cv as cv
        from memories.search.fusion import RANKING
        from memories.search.hybrid import search_memories
        from memories.search.query import SearchQuery

        org, _ = Organization.objects.get_or_create(slug="locomo", defaults={"name": "LoCoMo", "tier": "unlimited"})
        start = timezone.now() - timedelta(days=1)
        stacks = [load_conversation(c, org, start)[0] for c in dataset["conversations"]]
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE memories_memory")
        window = max(RANKING.context_window, 2)
        conversations = [(stack, cv.load_conversation(stack, window)) for stack in stacks]
        asked = []
        for index, conversation in enumerate(dataset["conversations"]):
            known = set(conversations[index][1].record_ids.values())
            qas = [q for q in conversation["qa"] if q.get("evidence")]
            if args.limit_questions:
                qas = qas[: args.limit_questions]
            for qa in qas:
                evidence = {e.strip() for e in qa["evidence"] if e.strip() in known}
                if evidence:
                    asked.append({"conversation": index, "question": str(qa["question"]), "evidence": evidence,
                                  "category": int(qa.get("category", 0))})
        log(f"{len(asked)} questions; reading each one's legs once")
        questions = cv.read_legs(conversations, asked, Path(env.workdir) / "cv-legs.pkl" if args.data_dir else None)
        convs = [c for _, c in conversations]
        names = [c.name for c in convs]
        served = {}
        for q in questions:
            hits = search_memories(stack_ids=[conversations[q.conversation][0].pk],
                                   query=SearchQuery(text=q.text, limit=cv.LIMIT)).hits
            served[f"{q.conversation}:{q.text}"] = [h.memory.record_id for h in hits]
        now = timezone.now()
        same, total = cv.agreement(questions, served, convs, RANKING, now)
        print(f"\nagreement: the replay of the served constants gives the service's own top 10 for {same} of {total} "
              f"questions")
        grid = cv.GRID if args.grid == "full" else cv.SMALL_GRID
        points = cv.grid_points(RANKING, grid)
        log(f"{len(points)} grid points x {len(questions)} questions")
        began = time.monotonic()
        scores = cv.score_grid(questions, convs, points, now, log=log)
        log(f"grid scored in {time.monotonic() - began:.0f}s")
        # "before": the ranking served before docs/algorithms.md §7.6's change, on every fold.
        before = cv.score_grid(questions, convs, [cv.before_constants()], now, ranker=cv.replay_before)[0]
        plateau = cv.grid_neighbours(points, grid) if args.select == "plateau" else None
        result = cv.cross_validate(scores, questions, before, plateau=plateau)
        title = (f"leave-one-conversation-out, {len(questions)} questions (all categories), grid {grid}, "
                 f"selection by {args.select}")
        print_table(title, cv.fold_table(result, questions, names, points, grid))
        fold_of = np.array([q.conversation for q in questions])
        below = [names[f] for f in result.folds
                 if result.after[fold_of == f, 1].mean() < result.before[fold_of == f, 1].mean()]
        mean_after = np.mean([result.after[fold_of == f, 1].mean() for f in result.folds])
        print(f"\ngoal: cross-validated R@10 >= 0.78 (mean of folds {mean_after:.3f}) and no fold below before "
              f"({'none is' if not below else ', '.join(below) + (' is' if len(below) == 1 else ' are')})")
        print_table("per category, held-out questions pooled", cv.category_table(result, questions))
        everything = cv.cross_validate(scores, questions, before, train_on_all=True, plateau=plateau).chosen[0]
        print("\nchosen on all five conversations (what the service would ship): "
              + " ".join(f"{k}={getattr(points[everything], k)}" for k in grid))
        shipped = next((i for i, p in enumerate(points) if p == RANKING), None)
        if shipped is not None:
            per_fold = {names[f]: float(scores[shipped, fold_of == f, 1].mean()) for f in sorted(set(fold_of.tolist()))}
            print("served constants, R@10 per fold (in-sample: chosen on all five): "
                  + ", ".join(f"{n} {v:.3f}" for n, v in per_fold.items())
                  + f"; mean of folds {np.mean(list(per_fold.values())):.3f}")
        if len(grid) == 2:
            first, second = grid
            at = {(getattr(p, first), getattr(p, second)): i for i, p in enumerate(points)}
            for metric, label in ((1, "R@10"), (2, "MRR")):
                print_table(f"{label} on all five conversations per grid point (rows {first}, columns {second})", [
                    {first: a, **{str(b): f"{scores[at[a, b], :, metric].mean():.3f}" for b in grid[second]}}
                    for a in grid[first]])
        for name, rows in cv.constant_curves(scores, questions, points, RANKING, grid, names).items():
            print_table(f"{name}: R@10 on each fold's training conversations, the other constants at the served "
                        f"values (* = that fold's optimum)", rows)
        if args.signals:
            from bench import retrieval_signals

            retrieval_signals.run(questions, convs, names, now, log=log,
                                  only=() if args.signals == "all" else args.signals.split(","))


if __name__ == "__main__":
    main()
