"""Redaction at ingest (issue 16): each memory keeps what redaction replaced, `[{"rule", "count"}]`
(memories.privacy.redaction, docs/algorithms.md §11). A JSON column with a constant database default
('[]'): PostgreSQL stores it in the catalogue, so the large memory table is not rewritten, and SQL
that does not name the column (a previous release's process during the deploy) still inserts.
"""

import django.db.models.expressions
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memories', '0012_jobrun_organization_counts'),
    ]

    operations = [
        migrations.AddField(
            model_name='memory',
            name='redaction_report',
            field=models.JSONField(blank=True, db_default=django.db.models.expressions.Value(
                [], output_field=models.JSONField()), default=list),
        ),
    ]
