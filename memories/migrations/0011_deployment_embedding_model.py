"""The deployment's embedding model (`DeploymentEmbeddingModel`, docs/algorithms.md §10.3).

Created empty: the first process that embeds after this migration records its configured model
(with the new default, MiniLM under `make run` and in every shell) and leaves it unverified, so
the sweep looks once for vectors of another model and re-embeds them. Not seeded from the
stored vectors on purpose: after a stray `reembed` (issue 12) most of them are of the wrong model.
A new table only: no lock on the memory table.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memories', '0010_drop_memory_salience'),
    ]

    operations = [
        migrations.CreateModel(
            name='DeploymentEmbeddingModel',
            fields=[
                ('id', models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ('model_id', models.CharField(max_length=100)),
                ('recorded_at', models.DateTimeField()),
                ('verified_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'constraints': [
                    models.CheckConstraint(condition=models.Q(('id', 1)), name='memories_embedding_model_one_row'),
                ],
            },
        ),
    ]
