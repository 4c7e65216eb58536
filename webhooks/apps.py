from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    """Signed webhooks for the schools' own backends: one more consumer of the change-event path
    (memories.changes.publish). The fan-out only records deliveries; Celery tasks send them (dispatch.py)."""

    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every committed ChangeEvent (and every relay of an unpublished one) of a school with an
        # enabled endpoint reaches the fan-out, which is idempotent: a delivery is unique per
        # (endpoint, event).
        from memories.governance.erasure import register_stack_eraser
        from memories.writes.effects import register_event_consumer
        from webhooks.dispatch import WANTED_IF_SQL, consume_event
        from webhooks.services import deliveries_erase_for_stack

        register_event_consumer(consume_event, wanted_if=WANTED_IF_SQL)
        # An erased student's pending (and logged) deliveries go with the rest of the stack.
        register_stack_eraser(deliveries_erase_for_stack)
