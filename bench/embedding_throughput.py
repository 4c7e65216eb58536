"""Embedding throughput: the Celery pipeline next to the bare model, in the same run.

* bare model: all-MiniLM-L6-v2 (one torch thread) embedding the texts in batches of 64, in-process;
* pipeline: memories written through the ingest service (in batches, as sync pushes do); each
  commit queues `memories.embed_memories` tasks; one real Celery worker process (solo pool, one
  torch thread: the same CPU budget as the bare model) claims, embeds and stores them. Timed from
  the first commit until the backlog is empty. The worker is started and warmed up first, so
  model loading is not counted on either side.

Goal: pipeline >= 0.8x the bare model.

    .venv/bin/python bench/embedding_throughput.py --memories 2000
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import BASE_DIR, bench_environment, log, print_table, synthetic_sentence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=250, help="memories per ingest transaction")
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
        print_table(f"Embedding throughput, {len(texts):,} memories (all-MiniLM-L6-v2, one torch thread)", [
            {"what": "baseline: bare model, batches of 64", "seconds": bare_s, "texts/s": bare_rate, "ratio": 1.0},
            {"what": "Celery pipeline: ingest -> after-commit tasks -> worker -> stored",
             "seconds": pipeline_s, "texts/s": pipeline_rate, "ratio": pipeline_rate / bare_rate},
        ])
        print(f"\nGoal: pipeline >= 0.8x bare model; measured {pipeline_rate / bare_rate:.2f}x")


if __name__ == "__main__":
    main()
