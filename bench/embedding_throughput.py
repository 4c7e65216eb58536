"""Embedding throughput: the model's runtimes side by side, then the Celery pipeline next to the bare
model, in the same run.

* runtimes: all-MiniLM-L6-v2 on torch (the old path: sentence-transformers, batches of 64, the
  TorchScript trace for one query), on ONNX Runtime fp32 and on ONNX Runtime int8 (the default;
  exports made by `make install`), each on one thread. Per runtime: texts per second per core
  (texts / CPU seconds of this process, so a busy box's waiting is not counted; wall-clock
  texts/s next to it), query latency p50/p95 (one short text through `embed`, uncached) and its
  CPU time per query (the per-core figure for queries), and
  the cosine of its vectors to torch's (worst and mean) on the same texts;
* bare model: the default runtime embedding the texts in batches of 64, in-process;
* pipeline: memories written through the ingest service (in batches, as sync pushes do); each
  commit queues `memories.embed_memories` tasks; one real Celery worker process (solo pool, one
  torch thread: the same CPU budget as the bare model) claims, embeds and stores them. Timed from
  the first commit until the backlog is empty. The worker is started and warmed up first, so
  model loading is not counted on either side.

Goal: pipeline >= 0.8x the bare model.

    .venv/bin/python bench/embedding_throughput.py --memories 2000 [--queries 200] [--skip-pipeline]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import BASE_DIR, bench_environment, log, print_table, synthetic_sentence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=250, help="memories per ingest transaction")
    parser.add_argument("--queries", type=int, default=200, help="single-text query embeddings per runtime")
    parser.add_argument("--skip-pipeline", action="store_true", help="only compare the runtimes")
    args = parser.parse_args()
    os.environ["EMBEDDING_PROVIDER"] = "minilm"

    with bench_environment("embedding") as env:
        from accounts.models import Organization
        from memories.search.embedding_jobs import embedding_backlog_count
        from memories.search.embeddings import MiniLMEmbedder
        from memories.services import memory_batch_create
        from memoryhub.celery import app
        from memoryhub.embedded import ManagedProcess
        from stacks.models import Stack

        rng = random.Random(5)
        texts = [synthetic_sentence(rng, words=rng.randint(8, 30)) for _ in range(args.memories)]
        queries = [synthetic_sentence(rng, words=rng.randint(4, 12)).rstrip(".") + "?" for _ in range(args.queries)]

        # --- the runtimes, side by side -----------------------------------------------------------------
        rows, torch_vectors = [], None
        for runtime in ("torch", "onnx", "onnx-int8"):
            embedder = MiniLMEmbedder(runtime=runtime)
            if embedder.runtime != runtime:
                log(f"{runtime}: export missing, skipped (run `make install`)")
                continue
            row, vectors = measure_runtime(embedder, texts, queries)
            if torch_vectors is None:
                torch_vectors = vectors
                torch_rate, torch_query_cpu = row["texts/s per core"], row["query CPU ms"]
            row["batch speed-up"] = row["texts/s per core"] / torch_rate
            row["query speed-up"] = torch_query_cpu / row["query CPU ms"]
            row.update(cosine_to(vectors, torch_vectors))
            rows.append(row)
            log(f"{runtime}: {row['texts/s per core']:.1f} texts/s per core")
        print_table(f"all-MiniLM-L6-v2 runtimes, {len(texts):,} texts in batches of 64 and {len(queries)} queries, "
                    "one thread each", rows)
        if args.skip_pipeline:
            return

        # --- baseline: the bare model -----------------------------------------------------------------
        model = MiniLMEmbedder()
        model.embed(["warm up"])
        started = time.perf_counter()
        for start in range(0, len(texts), 64):
            model.embed(texts[start:start + 64])
        bare_s = time.perf_counter() - started
        log(f"bare model: {len(texts) / bare_s:.1f} texts/s")

        # --- the pipeline -------------------------------------------------------------------------------
        worker = ManagedProcess(
            name="worker",
            argv=[sys.executable, "-m", "celery", "-A", "memoryhub", "worker", "--pool", "solo", "--loglevel",
                  "WARNING", "--hostname", f"bench-{os.getpid()}@%h", "--without-mingle", "--without-gossip"],
            env=env.subprocess_env(EMBEDDING_PROVIDER="minilm"), cwd=BASE_DIR, log_path=env.workdir / "worker.log",
        )
        worker.start()
        try:
            deadline = time.monotonic() + 120
            while not app.control.ping(timeout=0.5):
                if time.monotonic() > deadline or not worker.running():
                    raise SystemExit("worker did not start:\n" + (env.workdir / "worker.log").read_text()[-3000:])
            org = Organization.objects.create(name="Embed bench", slug="embed-bench", tier="unlimited")
            stack = Stack.objects.create(organization=org, slug="embed")
            # Warm the worker (model load) with one memory, outside the timing.
            memory_batch_create(stack=stack, items=[{"kind": "note", "content": "warm up"}], source="bench")
            while embedding_backlog_count():
                time.sleep(0.1)
            started = time.perf_counter()
            for start in range(0, len(texts), args.batch):
                memory_batch_create(stack=stack, items=[{"kind": "note", "content": t}
                                                        for t in texts[start:start + args.batch]], source="bench")
            while embedding_backlog_count():
                time.sleep(0.05)
            pipeline_s = time.perf_counter() - started
        finally:
            worker.stop()

        bare_rate = len(texts) / bare_s
        pipeline_rate = len(texts) / pipeline_s
        print_table(f"Embedding throughput, {len(texts):,} memories ({model.model_id} on {model.runtime}, 1 thread)", [
            {"what": "baseline: bare model, batches of 64", "seconds": bare_s, "texts/s": bare_rate, "ratio": 1.0},
            {"what": "Celery pipeline: ingest -> after-commit tasks -> worker -> stored",
             "seconds": pipeline_s, "texts/s": pipeline_rate, "ratio": pipeline_rate / bare_rate},
        ])
        print(f"\nGoal: pipeline >= 0.8x bare model; measured {pipeline_rate / bare_rate:.2f}x")


def measure_runtime(embedder: Any, texts: list[str], queries: list[str]) -> tuple[dict[str, Any], Any]:
    """Batch throughput (per CPU second and per wall second) and single-query latency of one runtime."""
    import numpy as np

    embedder.embed(texts[:64])  # load and warm up, outside the timing
    cpu, wall = time.process_time(), time.perf_counter()
    vectors = []
    for start in range(0, len(texts), 64):
        vectors.extend(embedder.embed(texts[start:start + 64]))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    latencies = []
    query_cpu = time.process_time()
    for query in queries:
        started = time.perf_counter()
        embedder.embed([query])
        latencies.append((time.perf_counter() - started) * 1000)
    query_cpu = time.process_time() - query_cpu
    cuts = statistics.quantiles(latencies, n=20)
    return ({"runtime": embedder.runtime, "model id": embedder.model_id, "texts/s per core": len(texts) / cpu,
             "texts/s wall": len(texts) / wall, "query p50 ms": statistics.median(latencies),
             "query p95 ms": cuts[18], "query CPU ms": query_cpu * 1000 / len(queries)}, np.asarray(vectors))


def cosine_to(vectors: Any, reference: Any) -> dict[str, str]:
    cosines = (vectors * reference).sum(axis=1)  # both unit length
    # As text: the table rounds floats to 2 decimals, and the third decimal is the point here.
    return {"cosine to torch, worst": f"{cosines.min():.4f}", "mean": f"{cosines.mean():.4f}"}


if __name__ == "__main__":
    main()
