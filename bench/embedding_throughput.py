"""Embedding throughput: the model's runtimes side by side, then the Celery pipeline next to the bare
model, in the same run.

* runtimes: all-MiniLM-L6-v2 on torch (the old path: sentence-transformers, batches of 64, the
  TorchScript trace for one query), on ONNX Runtime fp32 and on ONNX Runtime int8 (the default;
  exports made by `make install`), each on one thread. Per runtime: texts per second per core
  (texts / CPU seconds of this process, so a busy box's waiting is not counted; wall-clock
  texts/s next to it), query latency p50/p95 (one short text through `embed`, uncached) and its
  CPU time per query (the per-core figure for queries), and
  the cosine of its vectors to torch's (worst and mean) on the same texts;
* bare model: the default runtime embedding the texts in batches of 64, in-process (texts per
  wall second and per CPU second);
* pipeline: memories written through the ingest service (in batches of `--batch`, as pushes do);
  each commit queues `memories.embed_memories` tasks; one real Celery worker process (solo pool,
  one ONNX thread: the bare model's CPU budget for the model) claims, embeds and stores them.
  Three runs per message size (`--message-ids`: 64 = native batch creates, 500 = sync pushes):
  - "drain": N memories pushed while the worker consumes nothing, then timed from the moment it
    consumes until `embedding_backlog` == 0 (time to searchable after a big push);
  - "live": timed from the first commit, ingest and embedding at once (ingest runs in this
    process and competes for the same cores).
  Each run also reports the worker's CPU seconds (memories per worker CPU second: the per-core
  figure set against the bare model's) and Postgres' CPU seconds per memory (the UPDATE's index
  maintenance; ingest included in "live").
  The worker is started and warmed up first, so model loading is not counted on either side.

* small tasks (`--small-tasks`, instead of the pipeline runs): N memories written in bench/soak.py's
  push sizes (80 % of 1-5, 17 % of 6-50, 3 % of 51-500), their after-commit tasks collected and
  worked in order by `memories_embed` in this process, each on its own ids (before) and filled from
  its stack's backlog (now, the task's `fill=True`), interleaved for `--rounds` on fresh stacks:
  stores, memories per CPU second of this process against the bare model, Postgres CPU per memory.

Goal: pipeline >= 0.7x the bare model per core.

    .venv/bin/python bench/embedding_throughput.py --memories 2000 [--queries 200] [--skip-runtimes] \
        [--skip-pipeline] [--message-ids 64,500]
    .venv/bin/python bench/embedding_throughput.py --memories 1000 --small-tasks --skip-runtimes [--rounds 2]
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

from bench.harness import BASE_DIR, bench_environment, log, print_table
from bench.synthetic import synthetic_sentence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=250, help="memories per ingest transaction")
    parser.add_argument("--queries", type=int, default=200, help="single-text query embeddings per runtime")
    parser.add_argument("--message-ids", default="64,500",
                        help="ids per embedding task to measure (64: native batch creates, 500: sync pushes)")
    parser.add_argument("--skip-runtimes", action="store_true", help="only the bare model and the pipeline")
    parser.add_argument("--skip-pipeline", action="store_true", help="only compare the runtimes")
    parser.add_argument("--small-tasks", action="store_true",
                        help="only the bare model and the soak's small tasks, without and with filling")
    parser.add_argument("--rounds", type=int, default=2, help="--small-tasks: rounds of each, interleaved")
    args = parser.parse_args()
    os.environ["EMBEDDING_PROVIDER"] = "minilm"

    with bench_environment("embedding") as env:
        from memories.search.embeddings import MiniLMEmbedder

        rng = random.Random(5)
        texts = [synthetic_sentence(rng, words=rng.randint(8, 30)) for _ in range(args.memories)]
        queries = [synthetic_sentence(rng, words=rng.randint(4, 12)).rstrip(".") + "?" for _ in range(args.queries)]

        # --- the runtimes, side by side -----------------------------------------------------------------
        if not args.skip_runtimes:
            compare_runtimes(texts, queries)
        if args.skip_pipeline:
            return

        # --- baseline: the bare model -----------------------------------------------------------------
        model = MiniLMEmbedder()
        model.embed(["warm up"])
        started, cpu = time.perf_counter(), time.process_time()
        for start in range(0, len(texts), 64):
            model.embed(texts[start:start + 64])
        bare_s, bare_cpu = time.perf_counter() - started, time.process_time() - cpu
        log(f"bare model: {len(texts) / bare_s:.1f} texts/s, {len(texts) / bare_cpu:.1f} per CPU second")
        if args.small_tasks:
            measure_small_tasks(env, texts, bare_s, bare_cpu, args.rounds)
            return

        # --- the pipeline -------------------------------------------------------------------------------
        runs = measure_pipeline(env, texts, args.batch, [int(n) for n in args.message_ids.split(",")])

        bare_rate, bare_core = len(texts) / bare_s, len(texts) / bare_cpu
        table = [{"what": "baseline: bare model, batches of 64", "seconds": bare_s, "memories/s": bare_rate,
                  "ratio": 1.0, "worker CPU s": bare_cpu, "per worker core": bare_core, "ratio per core": 1.0,
                  "Postgres CPU ms/memory": ""}]
        for run in runs:
            rate, core = len(texts) / run["seconds"], len(texts) / run["worker_cpu"]
            table.append({"what": run["what"], "seconds": run["seconds"], "memories/s": rate,
                          "ratio": rate / bare_rate, "worker CPU s": run["worker_cpu"], "per worker core": core,
                          "ratio per core": core / bare_core,
                          "Postgres CPU ms/memory": run["postgres_cpu"] * 1000 / len(texts)})
        print_table(f"Embedding throughput, {len(texts):,} memories ({model.model_id} on {model.runtime}, 1 thread); "
                    "pipeline = ingest -> after-commit tasks -> one solo Celery worker -> stored", table)
        worst = min(len(texts) / run["worker_cpu"] for run in runs) / bare_core
        print(f"\nGoal: pipeline >= 0.7x bare model per core; measured {worst:.2f}x at worst "
              f"(wall-clock ratios depend on what else the box runs)")


def compare_runtimes(texts: list[str], queries: list[str]) -> None:
    from memories.search.embeddings import MiniLMEmbedder

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


def measure_pipeline(env: Any, texts: list[str], batch: int, message_sizes: list[int]) -> list[dict[str, Any]]:
    """The drain and live runs per message size (see the module docstring), each on a fresh stack."""
    from accounts.models import Organization
    from memories.search.embedding_backlog import embedding_backlog_count
    from memories.services import memory_batch_create
    from memories.writes import rows as write_rows
    from memoryhub.celery import app
    from memoryhub.embedded import ManagedProcess
    from memoryhub.schedule import EMBEDDING_QUEUE, WORKER_QUEUES
    from stacks.models import Stack

    worker = ManagedProcess(
        name="worker",
        argv=[sys.executable, "-m", "celery", "-A", "memoryhub", "worker", "--pool", "solo", "--loglevel",
              "WARNING", "--hostname", f"bench-{os.getpid()}@%h", "--queues", WORKER_QUEUES,
              "--without-mingle", "--without-gossip"],
        env=env.subprocess_env(EMBEDDING_PROVIDER="minilm"), cwd=BASE_DIR, log_path=env.workdir / "worker.log",
    )
    worker.start()
    results: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 120
        while not (replies := app.control.ping(timeout=0.5)):
            if time.monotonic() > deadline or not worker.running():
                raise SystemExit("worker did not start:\n" + (env.workdir / "worker.log").read_text()[-3000:])
        node = next(iter(replies[0]))
        postmaster = env.workdir / "postgres" / "postmaster.pid"
        postgres_pid = int(postmaster.read_text().split()[0]) if postmaster.is_file() else None
        org = Organization.objects.create(name="Embed bench", slug="embed-bench", tier="unlimited")
        # Warm the worker (model load) with one memory, outside the timing.
        memory_batch_create(stack=Stack.objects.create(organization=org, slug="warm"),
                            items=[{"kind": "note", "content": "warm up"}], source="bench")
        while embedding_backlog_count():
            time.sleep(0.1)

        def push(stack: Any) -> None:
            for start in range(0, len(texts), batch):
                memory_batch_create(stack=stack, items=[{"kind": "note", "content": t}
                                                        for t in texts[start:start + batch]], source="bench")

        def drained(started: float, cpu: tuple[float, float]) -> tuple[float, float, float]:
            while embedding_backlog_count():
                time.sleep(0.02)
            seconds = time.perf_counter() - started
            worker_cpu, postgres_cpu = cpu_seconds(worker.pid), cpu_seconds(postgres_pid)
            return seconds, worker_cpu - cpu[0], postgres_cpu - cpu[1]

        for size in message_sizes:
            # The ingest service's message size for native creates stands in for each size here
            # (sync pushes send 500 ids per message).
            write_rows.SMALL_EMBED_MESSAGE_IDS = size
            for mode in ("drain", "live"):
                stack = Stack.objects.create(organization=org, slug=f"{mode}-{size}")
                if mode == "drain":
                    app.control.cancel_consumer(EMBEDDING_QUEUE, destination=[node], reply=True)
                    push(stack)
                    cpu = (cpu_seconds(worker.pid), cpu_seconds(postgres_pid))
                    started = time.perf_counter()
                    app.control.add_consumer(EMBEDDING_QUEUE, destination=[node], reply=True)
                else:
                    cpu = (cpu_seconds(worker.pid), cpu_seconds(postgres_pid))
                    started = time.perf_counter()
                    push(stack)
                seconds, worker_cpu, postgres_cpu = drained(started, cpu)
                what = (f"pipeline, tasks of {size} ids: " +
                        ("pushed first, then drained" if mode == "drain" else "pushed and embedded at once"))
                results.append({"what": what, "seconds": seconds, "worker_cpu": worker_cpu,
                                "postgres_cpu": postgres_cpu})
                log(f"{what}: {len(texts) / seconds:.1f} memories/s, {len(texts) / worker_cpu:.1f} per worker "
                    f"CPU second, Postgres {postgres_cpu * 1000 / len(texts):.2f} CPU ms per memory")
    finally:
        worker.stop()
    return results


SOAK_WRITE_SIZES = ((80, 1, 5), (17, 6, 50), (3, 51, 500))  # bench/soak.py's push sizes (weight %, min, max)


def measure_small_tasks(env: Any, texts: list[str], bare_s: float, bare_cpu: float, rounds: int) -> None:
    """The after-commit tasks of a soak-like ingest (writes of 1-5 memories mostly, bench/soak.py's
    sizes), worked in order by `memories_embed` in this process, without and with filling a short
    batch from its stack's backlog (the task's `fill=True`), interleaved on fresh stacks.
    In-process, so Celery's own cost per task is left out on both sides."""
    from accounts.models import Organization
    from memories.search.embedding_jobs import memories_embed
    from memories.search.embeddings import get_embedder
    from memories.services import memory_batch_create
    from memories.writes import hooks
    from stacks.models import Stack

    postmaster = env.workdir / "postgres" / "postmaster.pid"
    postgres_pid = int(postmaster.read_text().split()[0]) if postmaster.is_file() else None
    get_embedder().embed(["warm up"])
    rng = random.Random(19)
    sizes: list[int] = []
    while sum(sizes) < len(texts):
        _, low, high = rng.choices(SOAK_WRITE_SIZES, weights=[w for w, _, _ in SOAK_WRITE_SIZES])[0]
        sizes.append(min(rng.randint(low, high), len(texts) - sum(sizes)))
    org = Organization.objects.create(name="Small tasks bench", slug=f"small-{os.getpid()}", tier="unlimited")
    tasks: list[list[str]] = []
    send = hooks._send_embedding

    # The messages the writes would send, one per write (the one-waiting-message-per-stack marker,
    # docs/algorithms.md §10.2.1, is left out: this compares filling alone).
    def collect(ids: list[str], message_ids: int, **_: Any) -> None:
        tasks.extend(ids[start:start + message_ids] for start in range(0, len(ids), message_ids))

    hooks._send_embedding = collect
    rows = []
    try:
        for number in range(rounds):
            for fill in (False, True):
                stack = Stack.objects.create(organization=org, slug=f"small-{number}-{int(fill)}")
                tasks.clear()
                start = 0
                for size in sizes:
                    memory_batch_create(stack=stack, items=[{"kind": "note", "content": t}
                                                            for t in texts[start:start + size]], source="bench")
                    start += size
                cpu, pg, wall = time.process_time(), cpu_seconds(postgres_pid), time.perf_counter()
                embedded = stores = 0
                for ids in tasks:
                    result = memories_embed(ids=ids, fill=fill)
                    embedded += result.embedded
                    stores += bool(result.embedded)
                wall, cpu, pg = time.perf_counter() - wall, time.process_time() - cpu, cpu_seconds(postgres_pid) - pg
                rows.append({"what": f"{len(tasks)} tasks of a soak-like ingest, " +
                             ("filled from the stack's backlog (now)" if fill else "each its own ids (before)"),
                             "embedded": embedded, "tasks that stored": stores, "memories/s": embedded / wall,
                             "ratio": (embedded / wall) / (len(texts) / bare_s), "per worker core": embedded / cpu,
                             "ratio per core": (embedded / cpu) / (len(texts) / bare_cpu),
                             "Postgres CPU ms/memory": pg * 1000 / max(embedded, 1)})
                log(f"{rows[-1]['what']}: {embedded / wall:.1f} memories/s, {embedded / cpu:.1f} per CPU second")
    finally:
        hooks._send_embedding = send
    rows.insert(0, {"what": "baseline: bare model, batches of 64", "embedded": len(texts), "tasks that stored": "",
                    "memories/s": len(texts) / bare_s, "ratio": 1.0, "per worker core": len(texts) / bare_cpu,
                    "ratio per core": 1.0, "Postgres CPU ms/memory": ""})
    print_table(f"Small after-commit tasks, {len(texts):,} memories in {len(sizes)} writes (bench/soak.py's sizes), "
                "worked in order in this process", rows)


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds of a process and its children so far (exited, reaped children included)."""
    import psutil

    if pid is None:
        return 0.0
    process = psutil.Process(pid)
    times = process.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in process.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += child_times.user + child_times.system
    return total


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
