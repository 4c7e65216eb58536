"""The decay pass's output moves to a narrow side table (issue 7).

Fillfactor 50: the pass rewrites most rows of this table on every run, and salience/computed_at are
not indexed, so with room left on each page an update stays on its page (HOT) and adds no index
entry. Nothing is copied from memories_memory.salience: salience is a function of stored state and
the time, and the next decay pass fills the table.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memories', '0004_embedding_storage_plain'),
    ]

    operations = [
        migrations.CreateModel(
            name='MemorySalience',
            fields=[
                ('memory', models.OneToOneField(
                    db_constraint=False, on_delete=django.db.models.deletion.CASCADE, primary_key=True,
                    related_name='salience_row', serialize=False, to='memories.memory')),
                ('salience', models.FloatField()),
                ('computed_at', models.DateTimeField()),
            ],
        ),
        migrations.RunSQL(
            "ALTER TABLE memories_memorysalience SET (fillfactor = 50)",
            reverse_sql="ALTER TABLE memories_memorysalience RESET (fillfactor)",
        ),
    ]
