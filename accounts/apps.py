from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts import (
            key_cache,
            schema,  # noqa: F401 - registers the OpenAPI auth extensions
        )

        key_cache.connect()  # every process that can change access invalidates the API-key cache
