"""Fill `Organization.overflow_tier` (accounts 0007) for subscriptions that already bill overflow:
a paid tier with overflow prices, in good standing, that is the organization's tier
(billing.selectors.overflow_tier_for; the rule is repeated here because a migration must not import
the app's code, which changes after it)."""

from django.db import migrations

OVERFLOW_TIERS = ("core", "pro")
OVERFLOW_STANDING = ("active", "cancelled")


def backfill(apps, schema_editor):
    Subscription = apps.get_model("billing", "Subscription")
    Organization = apps.get_model("accounts", "Organization")
    for subscription in Subscription.objects.filter(tier__in=OVERFLOW_TIERS, status__in=OVERFLOW_STANDING):
        Organization.objects.filter(pk=subscription.organization_id, tier=subscription.tier).update(
            overflow_tier=subscription.tier)


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0007_organization_overflow_tier"),
        ("billing", "0001_subscriptions_wallets_payments"),
    ]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
