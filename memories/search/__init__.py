"""The search room: turning memories into something findable, and finding them.

* `embeddings`         — embedding providers behind one interface (MiniLM, hash, OpenAI-compatible).
* `embedding_jobs`     — the embedding pipeline and its sweep (anything without a current embedding).
* `vector_indexes`     — per-stack HNSW indexes for large stacks, built and rebuilt concurrently.
* `hybrid`             — hybrid search: full-text + vector legs fused by reciprocal rank, weighted by decay.
* `smart_ingest`       — create / reinforce / update / supersede, decided by similarity to what is stored.
* `retrieval_feedback` — promote / demote / recall feedback from the agent.

See docs/algorithms.md for the constants and the fusion formula.
"""
