"""Drop the table-wide HNSW index on memories.embedding (issue 19; docs/algorithms.md §7.3).

Every embedding stored inserted the row into that one graph of the whole table: ~1.2 ms a row,
most of PostgreSQL's CPU under the soak (`bench/soak.py`, 100 agents: 0.9 of a core, the embedding
backlog growing; without the index 0.3 of a core and the backlog drained). It served little:
pgvector 0.6 filters a shared graph's results after the walk, so a stack that is a small share of
the table got poor recall from it, and stacks of more than 10,000 memories are walked through their
own partial index (memories.search.vector_indexes) anyway. Every other scope is now ranked exactly.

Dropped CONCURRENTLY, so writes continue meanwhile (a non-atomic migration). To put it back (e.g.
on a server with pgvector >= 0.8 iterative scans, for school-wide searches over millions of rows):
`CREATE INDEX CONCURRENTLY memories_embedding_hnsw ON memories_memory USING hnsw (embedding
vector_cosine_ops) WITH (m = 16, ef_construction = 64) WHERE forgotten_at IS NULL` - the search
code would then need its index-walk branch back (git history of memories/search/hybrid.py).
"""

from django.contrib.postgres.operations import RemoveIndexConcurrently
from django.db import migrations


class Migration(migrations.Migration):

    atomic = False  # DROP INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("memories", "0019_memory_fillfactor_two_rows"),
    ]

    operations = [
        RemoveIndexConcurrently(model_name="memory", name="memories_embedding_hnsw"),
    ]
