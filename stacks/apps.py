from django.apps import AppConfig


class StacksConfig(AppConfig):
    name = "stacks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from stacks import guardians

        guardians.connect()  # an accepted guardian invitation links its students (stacks/guardians.py)
