"""Drop `Memory.salience`: unused since the decay pass writes `MemorySalience` (migration 0005); only
the sync COPY's hand-written column list still named it, and that list now derives from the model.

Dropping a column in Postgres only marks it dropped in the catalog (no table rewrite, no index
touched): a brief ACCESS EXCLUSIVE lock, however large the table. The previous release's sync COPY
names the column, so restart its web processes with this release's code right after migrating.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('memories', '0009_salience_heap_block'),
    ]

    operations = [
        migrations.RemoveField(model_name='memory', name='salience'),
    ]
