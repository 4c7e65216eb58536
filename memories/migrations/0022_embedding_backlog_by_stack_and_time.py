"""The embedding backlog's partial index on (stack, server_updated_at) instead of (stack) alone
(docs/algorithms.md §10.2.2).

The sweep and the after-commit task's fill take each stack's oldest awaiting rows first, in turns
across stacks, so one school's large import no longer holds back another school's few new rows.
With the change time in the index, a stack's oldest awaiting rows are the first entries of its range
(no read and sort of the stack's whole backlog), and the dashboard finds a stack's oldest recent
waiting row in one probe.

Built CONCURRENTLY under a temporary name before the old index is dropped (CONCURRENTLY too) and
the new one takes its name, so the sweep and the dashboard's counts always have an index and writes
continue meanwhile (a non-atomic migration).
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

_BUILDING = "memories_embedding_backlog_new"


class Migration(migrations.Migration):

    atomic = False  # CREATE / DROP INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("memories", "0021_provenance_access_log"),
        ("stacks", "0004_stack_has_erasures"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="memory",
            index=models.Index(
                condition=models.Q(("embedded_version__isnull", True), ("deleted_at__isnull", True)),
                fields=["stack", "server_updated_at"],
                name=_BUILDING,
            ),
        ),
        RemoveIndexConcurrently(model_name="memory", name="memories_embedding_backlog"),
        migrations.RenameIndex(model_name="memory", new_name="memories_embedding_backlog", old_name=_BUILDING),
    ]
