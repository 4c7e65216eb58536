from django.apps import AppConfig


class StacksConfig(AppConfig):
    name = "stacks"
    default_auto_field = "django.db.models.BigAutoField"
