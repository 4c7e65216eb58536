"""The per-(stack, day) rollup of memories written (`StackDailyActivity`) and its backfill, with the
backfill of `Stack.last_write_at` (added by stacks 0002): both are maintained by the write kernel
from now on (memories.writes.rows.move_counters); these statements make the data written before
this release show up on the dashboard's overview.

What history can tell: when each stored memory was created, not every content change it had since.
So the backfill counts each stored memory once, on the UTC day of its `created_at`, and a stack's
last write is its newest memory's `created_at` (never later than now: `created_at` may come from a
client's clock). Both are set-based, one statement each; bench/dashboard.py runs the same two after
its bulk load, so the benchmark's rollup is exactly what an upgraded deployment would have.
"""

from django.db import migrations, models

# Soft-deleted rows (sync deletes) are not memories any more; forgotten ones were still written.
BACKFILL_ACTIVITY_SQL = """
INSERT INTO memories_stackdailyactivity (stack_id, day, written)
SELECT stack_id, (created_at AT TIME ZONE 'UTC')::date, count(*)
FROM memories_memory
WHERE deleted_at IS NULL
GROUP BY 1, 2
ON CONFLICT (stack_id, day) DO UPDATE SET written = EXCLUDED.written
"""

BACKFILL_LAST_WRITE_SQL = """
UPDATE stacks_stack AS s SET last_write_at = latest.at
FROM (SELECT stack_id, LEAST(max(created_at), now()) AS at
      FROM memories_memory WHERE deleted_at IS NULL GROUP BY stack_id) AS latest
WHERE s.id = latest.stack_id AND s.last_write_at IS NULL
"""


class Migration(migrations.Migration):

    dependencies = [
        ('memories', '0014_merge_0013_erasure_0013_redaction'),
        ('stacks', '0002_stack_last_write_at'),
    ]

    operations = [
        migrations.CreateModel(
            name='StackDailyActivity',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('day', models.DateField()),
                ('written', models.IntegerField(default=0)),
                ('stack', models.ForeignKey(db_index=False, on_delete=models.deletion.CASCADE,
                                            related_name='daily_activity', to='stacks.stack')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('stack', 'day'), name='memories_activity_stack_day')],
            },
        ),
        # Going back drops the table (above) and the column (stacks 0002): nothing to undo here.
        migrations.RunSQL(BACKFILL_ACTIVITY_SQL, reverse_sql=migrations.RunSQL.noop),
        migrations.RunSQL(BACKFILL_LAST_WRITE_SQL, reverse_sql=migrations.RunSQL.noop),
    ]
