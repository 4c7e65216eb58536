from django.contrib import admin

from webhooks.models import WebhookDelivery, WebhookEndpoint


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    list_display = ("public_id", "organization", "url", "enabled", "disabled_reason", "last_attempt_at")
    list_filter = ("enabled", "disabled_reason")
    search_fields = ("public_id", "url", "organization__slug")
    raw_id_fields = ("organization", "created_by")
    # The sealed secret is useless without SECRET_KEY, but there is no reason to show it either.
    exclude = ("secret_sealed",)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ("public_id", "endpoint", "event_type", "status", "attempts", "last_status_code", "created_at")
    list_filter = ("status",)
    search_fields = ("public_id", "endpoint__public_id")
    raw_id_fields = ("endpoint", "stack")
