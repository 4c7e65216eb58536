"""Merge of the two issue-16 branches (erasure and redaction); no operations."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0013_erasure"),
        ("memories", "0013_redaction"),
    ]

    operations = []
