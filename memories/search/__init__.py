"""The search room: turning memories into something findable, and finding them.

* `embeddings`         — embedding providers behind one interface (MiniLM, hash, OpenAI-compatible).
* `embedding_jobs`     — the embedding pipeline: claim, embed and store in batches; `embedding_claims` (Redis
  leases), `embedding_store` (the guarded write) and `embedding_backlog` (what awaits a vector, the sweep).
* `vector_indexes`     — per-stack HNSW indexes for large stacks, built and rebuilt concurrently.
* `hybrid`             — hybrid search, the one entry: full-text + vector legs fused by score, weighted by decay;
  `query` (request, answer, the legs' shared filters), `keyword_leg`, `vector_leg` and `fusion`
  (ranking and neighbouring-turn context) are its parts.
* `smart_ingest`       — create / reinforce / update / supersede, decided by similarity to what is stored.
* `retrieval_feedback` — promote / demote / recall feedback from the agent.

See docs/algorithms.md for the constants and the fusion formula.
"""
