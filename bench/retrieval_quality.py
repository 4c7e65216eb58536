"""Retrieval quality on LoCoMo (dev): MemoryHub's hybrid search next to plain BM25 and plain vector
search, all computed in the same run over the same texts.

Each conversation goes into its own stack, one memory per dialogue turn (written through the real
ingest service, embedded by the real embedding job with all-MiniLM-L6-v2). Every question with
evidence is asked; evidence recall@k = the share of a question's evidence turns found in the top
k, averaged over questions. Category 5 (adversarial: the answer is not in the conversation) has
no evidence to find and is skipped.

Baselines:
* BM25 — Okapi BM25 (k1 = 1.2, b = 0.75) over lowercase word tokens, in Python;
* vector — exact cosine ranking of the very same MiniLM vectors MemoryHub stored, in numpy.

    .venv/bin/python bench/retrieval_quality.py [--data ../shared/data/locomo-dev.json] [--limit-questions N]
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
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_environment, log, print_table

DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "locomo-dev.json"
TOKEN = re.compile(r"[a-z0-9]+")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--limit-questions", type=int, default=0, help="per conversation; 0 = all")
    args = parser.parse_args()
    dataset = json.loads(args.data.read_text())
    os.environ["EMBEDDING_PROVIDER"] = "minilm"

    with bench_environment("retrieval") as _env:
        from accounts.models import Organization
        from memories.models import Memory
        from memories.search.embedding_jobs import memories_embed
        from memories.search.hybrid import SearchQuery, search_memories
        from memories.services import memory_batch_create
        from stacks.models import Stack

        org = Organization.objects.create(name="LoCoMo", slug="locomo", tier="unlimited")
        methods = ("memoryhub", "bm25", "vector")
        per_method: dict[str, dict[int, list[float]]] = {m: {5: [], 10: []} for m in methods}
        per_category: dict[tuple[str, int], list[float]] = {}
        latency_ms: list[float] = []
        embed_s = 0.0
        turns_total = 0
        for conversation in dataset["conversations"]:
            stack = Stack.objects.create(organization=org, slug=f"conv-{conversation['id']}")
            items, texts, ids = [], [], []
            for session in conversation["sessions"]:
                for turn in session["turns"]:
                    text = turn_text(turn, session.get("date_time", ""))
                    items.append({"kind": "note", "record_id": turn["dia_id"], "content": text})
                    texts.append(text)
                    ids.append(turn["dia_id"])
            for start in range(0, len(items), 500):
                try:
                    memory_batch_create(stack=stack, items=items[start:start + 500], source="bench")
                except Exception as exc:
                    raise SystemExit(f"ingest refused a batch: {getattr(exc, 'fields', exc)}") from exc
            started = time.monotonic()
            memories_embed(ids=list(Memory.objects.filter(stack=stack).values_list("pk", flat=True)))
            embed_s += time.monotonic() - started
            turns_total += len(items)
            rows = list(Memory.objects.filter(stack=stack).values_list("record_id", "embedding"))
            vectors = {rid: np.asarray(vec, dtype=np.float32) for rid, vec in rows}
            matrix = np.stack([vectors[i] for i in ids])
            bm25 = BM25(texts)
            from memories.search.embeddings import embed_query

            questions = [q for q in conversation["qa"] if q.get("category") != 5 and q.get("evidence")]
            if args.limit_questions:
                questions = questions[: args.limit_questions]
            log(f"conversation {conversation['id']}: {len(items)} turns, {len(questions)} questions")
            for qa in questions:
                evidence = {e.strip() for e in qa["evidence"] if e.strip() in vectors}
                if not evidence:
                    continue
                question = str(qa["question"])
                started = time.perf_counter()
                hits = search_memories(stack_ids=[stack.pk], query=SearchQuery(text=question, limit=10)).hits
                latency_ms.append((time.perf_counter() - started) * 1000)
                found = {
                    "memoryhub": [h.memory.record_id for h in hits],
                    "bm25": [ids[i] for i in bm25.top(question, 10)],
                    "vector": [ids[i] for i in np.argsort(-(matrix @ np.asarray(embed_query(question))))[:10]],
                }
                for method in methods:
                    for k in (5, 10):
                        per_method[method][k].append(recall(found[method], evidence, k))
                    per_category.setdefault((method, int(qa.get("category", 0))), []).append(
                        recall(found[method], evidence, 10))

        rows = [{"method": m if m != "memoryhub" else "MemoryHub hybrid search",
                 "questions": len(per_method[m][5]),
                 "recall@5": float(np.mean(per_method[m][5])), "recall@10": float(np.mean(per_method[m][10]))}
                for m in methods]
        title = f"LoCoMo dev evidence recall ({len(dataset['conversations'])} conversations, {turns_total:,} turns)"
        print_table(title, rows)
        categories = sorted({c for _, c in per_category})
        print_table("recall@10 by question category", [
            {"category": c, **{m: float(np.mean(per_category.get((m, c), [math.nan]))) for m in methods}}
            for c in categories])
        p = sorted(latency_ms)
        print(f"\nMemoryHub search in-process latency: p50 {p[len(p) // 2]:.1f} ms, "
              f"p95 {p[int(len(p) * 0.95)]:.1f} ms; embedding {turns_total:,} turns took {embed_s:.1f}s")
        best = max(rows[1:], key=lambda r: r["recall@10"])
        print(f"Goal: MemoryHub beats both baselines. recall@10 {rows[0]['recall@10']:.3f} vs best baseline "
              f"{best['recall@10']:.3f} ({best['method']}); recall@5 {rows[0]['recall@5']:.3f} vs "
              f"{max(r['recall@5'] for r in rows[1:]):.3f}")


if __name__ == "__main__":
    main()
