# Retention per memory kind (issue 16): {kind: days}; empty keeps everything.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0003_organization_teachers_may_manage_keys'),
    ]

    operations = [
        migrations.AddField(
            model_name='organization',
            name='retention_days',
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
