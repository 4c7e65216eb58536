from django.apps import AppConfig


class MemoriesConfig(AppConfig):
    name = "memories"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Change events are published by an effect of the after-commit registry, which its module
        # registers when imported (memories.writes.effects, docs/architecture.md §5.3): in every
        # process, before its first write commits.
        import memories.changes.publish  # noqa: F401

        # Erasing a student or one memory also clears the corrections guardians proposed for it
        # (docs/guardians.md "Requests").
        from memories.governance.erasure import register_memory_eraser, register_stack_eraser
        from memories.governance.guardian_requests import requests_erase_for_memory, requests_erase_for_stack

        register_stack_eraser(requests_erase_for_stack)
        register_memory_eraser(requests_erase_for_memory)
