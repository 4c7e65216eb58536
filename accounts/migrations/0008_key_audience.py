# ApiKey.stack_agent and ApiKey.issued_by_key: what a stack-bound key may read of its stack's
# memories (docs/privacy.md "Keys and the grants"). Until now every key bound to a stack counted as
# the stack's own credentials and read every memory, whatever its grants said — also a key a school
# admin or teacher issued to read what their own session may not. What the keys already issued get:
#
# * stack_agent: True only for the keys of personal accounts (the kernle register flow and keys the
#   account's owner — the student or agent themself — issued for their own stack). A stack-bound key
#   of a school was issued by an admin, a teacher or a school key; it now reads what its issuer may
#   read. (An admin re-issues a tutor agent's key with the "student's own agent" choice.)
# * issued_by_key: the school-wide key that issued the key, from the audit log's `key.issued` event
#   (its `actor_key`), so that a key a school key minted does not read what the school key's person
#   may read; a cycled key keeps its predecessor's values, as a cycle does from now on.

from django.db import migrations, models


def backfill(apps, schema_editor):
    ApiKey = apps.get_model("accounts", "ApiKey")
    AuditEvent = apps.get_model("accounts", "AuditEvent")
    ApiKey.objects.filter(organization__kind="personal", stack__isnull=False).update(stack_agent=True)
    issuers = dict(
        AuditEvent.objects.filter(action="key.issued", target_type="api_key", actor_key__isnull=False,
                                  actor_key__stack__isnull=True)
        .values_list("target_id", "actor_key__public_id"))
    predecessor = dict(ApiKey.objects.filter(replaced_by__isnull=False).values_list("replaced_by_id", "pk"))
    chosen: dict[int, tuple[bool, str]] = {}  # pk -> (stack_agent, issued_by_key), oldest first: predecessors first
    for key in ApiKey.objects.order_by("created_at", "pk").only("pk", "public_id", "stack_agent"):
        # A cycled key keeps its predecessor's: its own `key.issued` names whoever cycled it.
        previous = predecessor.get(key.pk)
        values = chosen[previous] if previous in chosen else (key.stack_agent, issuers.get(key.public_id, ""))
        chosen[key.pk] = values
        if values != (key.stack_agent, ""):
            ApiKey.objects.filter(pk=key.pk).update(stack_agent=values[0], issued_by_key=values[1])


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0007_organization_overflow_tier'),
    ]

    operations = [
        migrations.AddField(
            model_name='apikey',
            name='stack_agent',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='apikey',
            name='issued_by_key',
            field=models.CharField(blank=True, default='', max_length=40),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
        migrations.AddConstraint(
            model_name='apikey',
            constraint=models.CheckConstraint(condition=models.Q(('stack_agent', False), ('stack__isnull', False),
                                                                 _connector='OR'),
                                              name='accounts_apikey_stack_agent_has_stack'),
        ),
    ]
