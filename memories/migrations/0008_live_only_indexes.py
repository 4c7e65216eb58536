"""Indexes that serve only reads of live memories leave forgotten rows out (issue 7, decay pass).

A decay tombstone stamps change_seq (indexed), so it is never a HOT update: the new row version got
an entry in every index of the table. Load, search and smart ingest all read with
`forgotten_at IS NULL`, so their indexes (the (stack, kind, -created_at) walk, the tsvector and tag
GINs, the HNSW graph) need no entry for a forgotten row, and Postgres adds none when the new version
fails an index's predicate. Bench (1M rows, a tombstone UPDATE of 36,747 rows, same run): 2.41 s with
full indexes, 2.03 s with the GINs partial, 1.76 s with the (stack, kind, created) index too - before
counting the HNSW insert, by far the most expensive, which the bench rows (no embedding) do not pay.
A recovered memory (forgotten_at back to NULL) is a new row version and is indexed again.

Each index is rebuilt CONCURRENTLY next to the old one and then takes its name
(memoryhub.index_swap): the HNSW graph of a million memories takes ~11 minutes to build, and a
plain CREATE INDEX would block every write for that long. Hence a non-atomic migration; it can be
re-run after an interruption.
"""

import django.contrib.postgres.indexes
import pgvector.django.indexes
from django.db import migrations, models

from memoryhub.index_swap import index_replace_concurrently

LIVE = models.Q(('forgotten_at__isnull', True))

ALL_ROWS = [
    models.Index(fields=['stack', 'kind', '-created_at'], name='memories_stack_kind_created'),
    django.contrib.postgres.indexes.GinIndex(fields=['search_vector'], name='memories_search_vector_gin'),
    django.contrib.postgres.indexes.GinIndex(fields=['tags'], name='memories_tags_gin'),
    pgvector.django.indexes.HnswIndex(ef_construction=64, fields=['embedding'], m=16, name='memories_embedding_hnsw',
                                      opclasses=['vector_cosine_ops']),
]
LIVE_ONLY = [
    models.Index(condition=LIVE, fields=['stack', 'kind', '-created_at'], name='memories_stack_kind_created'),
    django.contrib.postgres.indexes.GinIndex(condition=LIVE, fields=['search_vector'], name='memories_search_vector_gin'),
    django.contrib.postgres.indexes.GinIndex(condition=LIVE, fields=['tags'], name='memories_tags_gin'),
    pgvector.django.indexes.HnswIndex(condition=LIVE, ef_construction=64, fields=['embedding'], m=16,
                                      name='memories_embedding_hnsw', opclasses=['vector_cosine_ops']),
]


def _replace_all(indexes):
    def replace(apps, schema_editor):
        memory = apps.get_model('memories', 'Memory')
        with schema_editor.connection.cursor() as cursor:
            for index in indexes:
                def create_sql(temporary, index=index):
                    clone = index.clone()
                    clone.name = temporary
                    return str(clone.create_sql(memory, schema_editor, concurrently=True))

                index_replace_concurrently(cursor, name=index.name, create_sql=create_sql)

    return replace


class Migration(migrations.Migration):

    atomic = False  # CREATE / DROP INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ('memories', '0007_memory_toast_target'),
        ('stacks', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunPython(_replace_all(LIVE_ONLY), _replace_all(ALL_ROWS), atomic=False),
            ],
            state_operations=[
                *[migrations.RemoveIndex(model_name='memory', name=index.name) for index in ALL_ROWS],
                *[migrations.AddIndex(model_name='memory', index=index) for index in LIVE_ONLY],
            ],
        ),
    ]
