"""Indexes that serve only reads of live memories leave forgotten rows out (issue 7, decay pass).

A decay tombstone stamps change_seq (indexed), so it is never a HOT update: the new row version got
an entry in every index of the table. Load, search and smart ingest all read with
`forgotten_at IS NULL`, so their indexes (the (stack, kind, -created_at) walk, the tsvector and tag
GINs, the HNSW graph) need no entry for a forgotten row, and Postgres adds none when the new version
fails an index's predicate. Bench (1M rows, a tombstone UPDATE of 36,747 rows, same run): 2.41 s with
full indexes, 2.03 s with the GINs partial, 1.76 s with the (stack, kind, created) index too - before
counting the HNSW insert, by far the most expensive, which the bench rows (no embedding) do not pay.
A recovered memory (forgotten_at back to NULL) is a new row version and is indexed again.
Rebuilding the HNSW index takes a while on a large table; run it in a maintenance window.
"""

import django.contrib.postgres.indexes
import pgvector.django.indexes
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memories', '0007_memory_toast_target'),
        ('stacks', '0001_initial'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='memory',
            name='memories_stack_kind_created',
        ),
        migrations.RemoveIndex(
            model_name='memory',
            name='memories_search_vector_gin',
        ),
        migrations.RemoveIndex(
            model_name='memory',
            name='memories_tags_gin',
        ),
        migrations.RemoveIndex(
            model_name='memory',
            name='memories_embedding_hnsw',
        ),
        migrations.AddIndex(
            model_name='memory',
            index=models.Index(condition=models.Q(('forgotten_at__isnull', True)), fields=['stack', 'kind', '-created_at'], name='memories_stack_kind_created'),
        ),
        migrations.AddIndex(
            model_name='memory',
            index=django.contrib.postgres.indexes.GinIndex(condition=models.Q(('forgotten_at__isnull', True)), fields=['search_vector'], name='memories_search_vector_gin'),
        ),
        migrations.AddIndex(
            model_name='memory',
            index=django.contrib.postgres.indexes.GinIndex(condition=models.Q(('forgotten_at__isnull', True)), fields=['tags'], name='memories_tags_gin'),
        ),
        migrations.AddIndex(
            model_name='memory',
            index=pgvector.django.indexes.HnswIndex(condition=models.Q(('forgotten_at__isnull', True)), ef_construction=64, fields=['embedding'], m=16, name='memories_embedding_hnsw', opclasses=['vector_cosine_ops']),
        ),
    ]
