"""Each job run records every organization's share of its counts (`JobRun.organization_counts`), so a
school admin sees the runs with only their school's numbers (memories.lifecycle.jobs). A small
table; adding a column with a constant default rewrites nothing.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memories', '0011_deployment_embedding_model'),
    ]

    operations = [
        migrations.AddField(
            model_name='jobrun',
            name='organization_counts',
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
