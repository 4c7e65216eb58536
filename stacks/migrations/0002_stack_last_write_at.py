"""`Stack.last_write_at`: when a memory of the stack was last written, kept by the write kernel.
Nullable, so adding it rewrites nothing; memories 0015 backfills it from the stored memories."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('stacks', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='stack',
            name='last_write_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
