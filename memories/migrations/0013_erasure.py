"""Erasure with a certificate (issue 16): the certificate table and the id-only tombstones of erased
memories that the sync engine checks (memories.governance.erasure). Two new tables; nothing existing is rewritten.
"""

import uuid

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0003_organization_teachers_may_manage_keys"),
        ("memories", "0012_jobrun_organization_counts"),
        ("stacks", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ErasedRecord",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key_hash", models.CharField(max_length=64)),
                ("stack", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+",
                                            to="stacks.stack")),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("stack", "key_hash"),
                                                        name="memories_erasedrecord_unique")],
            },
        ),
        migrations.CreateModel(
            name="ErasureCertificate",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ("stack_ref", models.IntegerField()),
                ("stack_slug", models.CharField(max_length=100)),
                ("scope", models.CharField(choices=[("stack", "Stack"), ("memory", "Memory")], max_length=16)),
                ("memory_ref", models.UUIDField(blank=True, null=True)),
                ("requested_by", models.TextField()),
                ("erased_by_label", models.CharField(max_length=254)),
                ("status", models.CharField(choices=[("pending", "Pending"), ("running", "Running"), ("done", "Done"),
                                                     ("failed", "Failed")], default="pending", max_length=16)),
                ("counts", models.JSONField(blank=True, default=dict)),
                ("requested_at", models.DateTimeField(auto_now_add=True)),
                ("completed_at", models.DateTimeField(blank=True, null=True)),
                ("digest", models.CharField(blank=True, default="", max_length=64)),
                ("erased_by", models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL,
                                                related_name="+", to=settings.AUTH_USER_MODEL)),
                ("organization", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                                   related_name="erasure_certificates", to="accounts.organization")),
                ("stack", models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="+",
                                            to="stacks.stack")),
            ],
            options={
                "indexes": [models.Index(fields=["stack_ref", "scope", "status"], name="memories_erasure_stack")],
            },
        ),
    ]
