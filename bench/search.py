"""Search latency over HTTP (query embedding included) and vector recall@10 against exact search.

Full size (the target): 1,000,000 memories across 1,000 stacks, the largest 100,000.
`--scale 0.2` gives 200,000 across 200 (largest 20,000), and so on; the largest stack's own HNSW
build takes minutes at full size.

Stored vectors: every vocabulary word of the synthetic corpus is embedded once with the real
all-MiniLM-L6-v2, and a memory's vector is the normalised mean of its words' vectors plus a little
noise. That gives MiniLM's geometry (clustered, not uniform noise) without embedding a million
texts; rows are labelled with the real model id, so the server (EMBEDDING_PROVIDER=minilm) embeds
each query for real and searches these vectors.

Figures, all from one run:
* HTTP p50/p95/p99 of `POST /api/v1/stacks/{stack}/search` (limit 10) for the largest stack and
  for typical stacks, next to the bare query-embedding time measured in the same run, and the same
  queries to a second server with the access log off (`MEMORYHUB_ACCESS_LOG=false`), interleaved
  query by query: the p95 ratio is what the access log costs (docs/privacy.md "Access log");
* vector-leg recall@10 of the plan the server uses (the largest stack's own HNSW index, exact for
  the others) against an exact ranking of the same stack, and its in-process latency next to the
  exact plan's;
* a school-wide search (every stack of the school, ranked exactly: there is no table-wide vector
  index, docs/algorithms.md §7.3), in process;
* in-process search latency of ranking v2 next to v1 (docs/algorithms.md §7.5), same queries,
  interleaved, each paying its own query embedding, after one untimed search of each stack (so
  that neither ranking is timed reading a stack's pages for the first time).

A reused `--data-dir` has its table and index files read once first, so that they are in the OS
page cache as after a fresh load.

    .venv/bin/python bench/search.py --scale 0.2 --queries 200
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_environment, log, percentiles, print_table, web_server
from bench.synthetic import _WORDS, bulk_load_memories, create_bench_stacks, sync_stack_counters, synthetic_sentence


def word_space() -> tuple[dict[str, np.ndarray], float]:
    from memories.search.embeddings import MiniLMEmbedder

    model = MiniLMEmbedder()
    vocabulary = sorted({w.lower() for w in _WORDS})
    started = time.perf_counter()
    vectors = np.array(model.embed(vocabulary), dtype=np.float32)
    per_text_ms = (time.perf_counter() - started) * 1000 / len(vocabulary)
    return dict(zip(vocabulary, vectors, strict=True)), per_text_ms


def make_embed(words: dict[str, np.ndarray], seed: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    token = re.compile(r"[a-z]+")

    def embed(texts: list[str]) -> np.ndarray:
        out = np.empty((len(texts), 384), dtype=np.float32)
        for i, text in enumerate(texts):
            found = [words[t] for t in token.findall(text.lower()) if t in words]
            base = np.mean(found, axis=0) if found else rng.standard_normal(384).astype(np.float32)
            out[i] = base + rng.standard_normal(384).astype(np.float32) * 0.02
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    return embed


def explain_vector_leg(stack: Any, queries: list[str], model: Any) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of the vector leg's statement as the server runs it for `stack`
    (its own HNSW index, the ef_search the server would set): where the time goes, and how many
    pages came from the buffer cache (hit) versus the OS (read)."""
    from django.db import connection, transaction

    from memories.search.query import SearchQuery, over_fetch
    from memories.search.vector_leg import stack_index_ef_search, vector_sql

    for text in queries:
        query = SearchQuery(text=text, limit=10, min_similarity=0.0)
        fetch = over_fetch(10)
        sql, params = vector_sql(query, [stack.pk], model.embed([text])[0], fetch, exact=False, single_stack=True)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL hnsw.ef_search = {stack_index_ef_search(fetch)}")
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            print(f"\n-- {text!r}\n" + "\n".join(row[0] for row in cursor.fetchall()), flush=True)


def stack_plan(total: int, stacks: int, largest: int) -> list[int]:
    rest = total - largest
    sizes = [largest] + [rest // (stacks - 1)] * (stacks - 1)
    sizes[1] += rest - sum(sizes[1:])
    return sizes


def warm_page_cache() -> None:
    """Read the memory table's files and its indexes' once, so that they are in the OS page cache as
    after a fresh load: a data dir reused hours later is cold, and the first search of each typical
    stack (200 different stacks) would time the disk, not the search. Only for a local server's files."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        data_directory = Path(cursor.fetchone()[0])
        cursor.execute("SELECT pg_relation_filepath(c.oid) FROM pg_class c WHERE c.oid = 'memories_memory'::regclass "
                       "OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'memories_memory'::regclass)")
        files = [data_directory / row[0] for row in cursor.fetchall()]
    segments = [segment for base in files if base.exists()
                for segment in [base, *sorted(base.parent.glob(base.name + ".*"))] if segment.is_file()]
    started = time.monotonic()
    read = 0
    for segment in segments:
        with segment.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                read += len(chunk)
    log(f"read {read / 2**30:.1f} GiB of table and index files into the page cache "
        f"in {time.monotonic() - started:.0f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="1.0 = 1M memories / 1,000 stacks / largest 100k")
    parser.add_argument("--queries", type=int, default=200, help="HTTP queries per stack class")
    parser.add_argument("--recall-queries", type=int, default=100)
    parser.add_argument("--school-queries", type=int, default=20,
                        help="school-wide searches (every stack; ~1 s each at full size)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="keep the embedded database here; a later run at the same scale skips the load "
                             "and the index builds (tens of minutes at full size) and measures the same data")
    parser.add_argument("--explain", type=int, default=0, metavar="N",
                        help="also print EXPLAIN (ANALYZE, BUFFERS) of the largest stack's vector leg for N queries")
    args = parser.parse_args()
    total = int(1_000_000 * args.scale)
    n_stacks = max(2, int(1000 * args.scale))
    largest = int(100_000 * args.scale)

    # The bench process ranks with the same model id the server uses (the stored vectors carry it).
    os.environ["EMBEDDING_PROVIDER"] = "minilm"
    with bench_environment("search", data_dir=args.data_dir) as env:
        from django.db import connection

        from accounts.models import Membership, User
        from accounts.services import api_key_issue
        from memories.search.embeddings import MiniLMEmbedder
        from memories.search.query import SearchQuery, over_fetch
        from memories.search.vector_indexes import (
            STACK_INDEX_MIN_ROWS,
            stack_vector_index_ensure,
        )
        from memories.search.vector_leg import pgvector_version, vector_leg, vector_sql

        log("embedding the vocabulary with all-MiniLM-L6-v2")
        words, _ = word_space()
        model_id = MiniLMEmbedder().model_id
        stacks = create_bench_stacks(n_stacks)
        sizes = stack_plan(total, n_stacks, largest)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM memories_memory")
            loaded = cursor.fetchone()[0]
        if loaded == total and len(stacks) == n_stacks:
            log(f"reusing the {total:,} memories already in {args.data_dir}")
            load_s = 0.0
            if fixed := sync_stack_counters([s.pk for s in stacks]):
                log(f"set the usage counters of {fixed} stacks from their rows")
            warm_page_cache()
        elif loaded:
            sys.exit(f"{args.data_dir} holds {loaded:,} memories, not {total:,}: use another --data-dir")
        else:
            log(f"loading {total:,} memories into {n_stacks} stacks (largest {largest:,})")
            t0 = time.monotonic()
            bulk_load_memories(list(zip([s.pk for s in stacks], sizes, strict=True)), embed=make_embed(words, 1),
                               embedding_model=model_id, days_back=365)
            load_s = time.monotonic() - t0
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE memories_memory")
        org = stacks[0].organization
        user, _ = User.objects.get_or_create(username="bench", defaults={"email": "bench@example.test"})
        # A key needs its owner's access (accounts.services.api_key_issue).
        Membership.objects.get_or_create(user=user, organization=org, defaults={"role": Membership.Role.ADMIN})
        _, secret = api_key_issue(organization=org, user=user, stack_id=None, name="bench", read_only=False)

        rng = random.Random(11)
        big = stacks[0]
        typical = stacks[1:]
        queries = [synthetic_sentence(rng, words=rng.randint(3, 8)) for _ in range(args.queries * 2)]

        # --- baselines: the query embedding alone, as the server computes it (MINILM_RUNTIME, one text
        # path) and as sentence-transformers' own `encode` does -------------------------------------
        model = MiniLMEmbedder()  # the server's runtime (MINILM_RUNTIME)
        model.embed(["warm up"])
        reference = MiniLMEmbedder(runtime="torch")  # sentence-transformers' own `encode`, for comparison
        embed_ms: list[float] = []
        encode_ms: list[float] = []
        for q in queries[: args.queries]:
            started = time.perf_counter()
            model.embed([q])
            embed_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            reference._load().encode([q], normalize_embeddings=True, show_progress_bar=False)
            encode_ms.append((time.perf_counter() - started) * 1000)

        def measure_recall(label: str, candidates: list) -> dict:  # type: ignore[type-arg]
            recalls, plan_ms, exact_ms = [], [], []
            methods: dict[str, int] = {}
            for i in range(args.recall_queries):
                stack = candidates[i % len(candidates)]
                vector = model.embed([queries[i]])[0]
                query = SearchQuery(text=queries[i], limit=10, min_similarity=0.0)
                started = time.perf_counter()
                got, method = vector_leg(query, [stack.pk], vector, over_fetch(10), {})
                plan_ms.append((time.perf_counter() - started) * 1000)
                methods[method] = methods.get(method, 0) + 1
                sql, params = vector_sql(query, [stack.pk], vector, 10, exact=True)
                started = time.perf_counter()
                with connection.cursor() as cursor:
                    cursor.execute(sql, params)
                    truth = [row[0] for row in cursor.fetchall()]
                exact_ms.append((time.perf_counter() - started) * 1000)
                top = [row[0] for row in sorted(got, key=lambda r: -float(r[9]))[:10]]
                recalls.append(len(set(top) & set(truth)) / max(1, len(truth)))
            return {
                "what": f"vector leg, {label}", "recall@10": statistics.mean(recalls),
                "plan p50 ms": percentiles(plan_ms)["p50"], "plan p95 ms": percentiles(plan_ms)["p95"],
                "exact p50 ms (baseline)": percentiles(exact_ms)["p50"],
                "exact p95 ms (baseline)": percentiles(exact_ms)["p95"], "plan": ",".join(sorted(methods)),
            }

        large = [s for s, size in zip(stacks, sizes, strict=True) if size >= STACK_INDEX_MIN_ROWS]
        # (Until the periodic job builds the largest stack's own index, it is ranked exactly: the
        # "exact" columns of its row below.)
        started = time.monotonic()
        for stack in large:
            stack_vector_index_ensure(stack_id=stack.pk, concurrently=False)
        index_s = time.monotonic() - started
        log(f"built {len(large)} per-stack partial HNSW index(es) in {index_s:.0f}s")
        recall_rows = [measure_recall("largest stack (its own HNSW index from STACK_INDEX_MIN_ROWS)", [big])]
        recall_rows.append(measure_recall("typical stacks", typical))
        if args.explain:
            explain_vector_leg(big, queries[: args.explain], model)

        # --- HTTP -----------------------------------------------------------------------------------
        import httpx

        rows = []
        server_env = {"EMBEDDING_PROVIDER": "minilm", "THROTTLE_REQUEST_RATE": "1000000/min"}
        headers = {"Authorization": f"Bearer {secret}"}
        access_log_ratios = []
        with web_server(env, extra_env=server_env) as url, \
                web_server(env, extra_env={**server_env, "MEMORYHUB_ACCESS_LOG": "false"}) as url_off:
            logging.getLogger("httpx").setLevel(logging.WARNING)
            client = httpx.Client(base_url=url, headers=headers, timeout=30)
            client_off = httpx.Client(base_url=url_off, headers=headers, timeout=30)
            with client, client_off:
                health_ms = []
                for _ in range(args.queries):
                    started = time.perf_counter()
                    client.get("/health").raise_for_status()
                    health_ms.append((time.perf_counter() - started) * 1000)
                for each in (client, client_off):
                    each.post(f"/api/v1/stacks/{big.slug}/search", json={"query": "warm up the model"})
                classes = (("largest stack", lambda i: big), ("typical stacks", lambda i: rng.choice(typical)))
                for label, pick in classes:
                    samples = []
                    samples_off: list[float] = []
                    methods: dict[str, int] = {}
                    server: dict[str, list[float]] = {}
                    for i in range(args.queries):
                        stack = pick(i)
                        text = queries[i if label == "largest stack" else i + args.queries]
                        # The same query to the server without the access log, first on every other
                        # query, so that neither always finds the other's pages warm.
                        off_first = i % 2 == 0
                        if off_first:
                            started = time.perf_counter()
                            client_off.post(f"/api/v1/stacks/{stack.slug}/search",
                                            json={"query": text, "limit": 10}).raise_for_status()
                            samples_off.append((time.perf_counter() - started) * 1000)
                        started = time.perf_counter()
                        response = client.post(f"/api/v1/stacks/{stack.slug}/search",
                                               json={"query": text, "limit": 10})
                        samples.append((time.perf_counter() - started) * 1000)
                        response.raise_for_status()
                        if not off_first:
                            started = time.perf_counter()
                            client_off.post(f"/api/v1/stacks/{stack.slug}/search",
                                            json={"query": text, "limit": 10}).raise_for_status()
                            samples_off.append((time.perf_counter() - started) * 1000)
                        body = response.json()
                        methods[body["method"]] = methods.get(body["method"], 0) + 1
                        server.setdefault("took", []).append(body["took_ms"])
                        for name, value in body["timings_ms"].items():
                            server.setdefault(name, []).append(value)
                    p = percentiles(samples)
                    rows.append({"what": f"HTTP search, {label}", "n": p["n"], "p50 ms": p["p50"],
                                 "p95 ms": p["p95"], "p99 ms": p["p99"], "plan": ",".join(sorted(methods)),
                                 "server p50 (search/kw/embed/vec)": "/".join(
                                     f"{statistics.median(server.get(n, [0])):.1f}"
                                     for n in ("took", "keyword_ms", "embed_ms", "vector_ms"))})
                    p_off = percentiles(samples_off)
                    access_log_ratios.append((label, p_off["p95"] / p["p95"]))
                    rows.append({"what": f"HTTP search, {label}, access log off", "n": p_off["n"],
                                 "p50 ms": p_off["p50"], "p95 ms": p_off["p95"], "p99 ms": p_off["p99"], "plan": "-"})
        ph = percentiles(health_ms)
        rows.append({"what": "baseline: HTTP round trip of GET /health", "n": ph["n"], "p50 ms": ph["p50"],
                     "p95 ms": ph["p95"], "p99 ms": ph["p99"], "plan": "-"})
        for label, samples_ms in (("baseline: query embedding alone (the server's MiniLM runtime, 1 thread)", embed_ms),
                                  ("baseline: sentence-transformers encode() of the query", encode_ms)):
            pe = percentiles(samples_ms)
            rows.append({"what": label, "n": pe["n"], "p50 ms": pe["p50"], "p95 ms": pe["p95"], "p99 ms": pe["p99"],
                         "plan": "-"})

        # --- ranking v2 (docs/algorithms.md §7.5) against v1, in process, same queries, interleaved --
        from bench.search_rankings import search_ranked
        from memories.search.embeddings import query_cache
        from memories.search.hybrid import search_memories

        def search_with(ranking: str, stack_id: int, text: str) -> None:
            """v2 is the service's search; v1 the benchmark's baseline (bench/search_rankings.py)."""
            query = SearchQuery(text=text, limit=10)
            if ranking == "v2":
                search_memories(stack_ids=[stack_id], query=query)
            else:
                search_ranked(ranking, stack_ids=[stack_id], query=query)

        ranking_ms: dict[str, dict[str, list[float]]] = {}
        for label, pick in (("largest stack", lambda i: big), ("typical stacks", lambda i: typical[i % len(typical)])):
            # One untimed search per stack first: a stack's first search reads its pages from the
            # OS page cache (or from disk), which would land on whichever ranking happens to go
            # first; the HTTP rows above pay those first touches.
            for stack_id in {pick(i).pk for i in range(args.queries)}:
                search_with("v1", stack_id, queries[-1])
            for i in range(args.queries):
                for ranking in ("v1", "v2") if i % 2 else ("v2", "v1"):
                    query_cache.clear()  # each pays its own query embedding
                    started = time.perf_counter()
                    search_with(ranking, pick(i).pk, queries[i])
                    ranking_ms.setdefault(label, {}).setdefault(ranking, []).append(
                        (time.perf_counter() - started) * 1000)
        for label, by_ranking in ranking_ms.items():
            p1, p2 = percentiles(by_ranking["v1"]), percentiles(by_ranking["v2"])
            ratio = p2["p95"] / p1["p95"]
            rows.append({"what": f"in-process search, {label}: ranking v2 (v1) - p95 ratio {ratio:.2f}x",
                         "n": p2["n"], "p50 ms": f"{p2['p50']:.1f} ({p1['p50']:.1f})",
                         "p95 ms": f"{p2['p95']:.1f} ({p1['p95']:.1f})", "p99 ms": f"{p2['p99']:.1f} ({p1['p99']:.1f})",
                         "plan": "-"})

        # --- a school-wide search: every stack of the school, one exact scope ---------------------------
        school_ms: list[float] = []
        school_scope = [s.pk for s in stacks]
        for i in range(args.school_queries):
            query_cache.clear()
            started = time.perf_counter()
            result = search_memories(stack_ids=school_scope, query=SearchQuery(text=queries[i], limit=10))
            school_ms.append((time.perf_counter() - started) * 1000)
            assert result.method == "exact", result.method
        if school_ms:
            ps = percentiles(school_ms)
            rows.append({"what": f"in-process search, whole school ({n_stacks} stacks, {total:,} rows): exact",
                         "n": ps["n"], "p50 ms": ps["p50"], "p95 ms": ps["p95"], "p99 ms": ps["p99"], "plan": "exact"})

        print_table(f"Search: {total:,} memories, {n_stacks} stacks (largest {largest:,}, typical {sizes[2]:,}); "
                    f"pgvector {'.'.join(map(str, pgvector_version()))}; a stack's own HNSW index from "
                    f"{STACK_INDEX_MIN_ROWS:,} rows, exact below; load {load_s:.0f}s; per-stack indexes {index_s:.0f}s",
                    rows)
        print_table("Vector recall@10 against exact search (same stack, same query vector)", recall_rows)
        print("\nGoals: HTTP p95 < 50 ms; recall@10 >= 0.95; p95 without the access log >= 0.95 x p95 with it.")
        for label, ratio in access_log_ratios:
            print(f"access log, {label}: p95 off / on = {ratio:.3f} -> {'met' if ratio >= 0.95 else 'NOT met'}")


if __name__ == "__main__":
    main()
