from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0011_guardians_and_consent"),
    ]

    operations = [
        migrations.AddField(
            model_name="invitation",
            name="name",
            field=models.CharField(blank=True, default="", max_length=150),
        ),
    ]
