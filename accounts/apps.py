from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts import (
            key_cache,
            schema,  # noqa: F401 - registers the OpenAPI auth extensions
        )

        key_cache.connect()  # every process that can change access invalidates the API-key cache


class AdminConfig(admin_apps.AdminConfig):
    """django.contrib.admin with our site (accounts/admin_site.py: the sign-in lockout), installed
    in INSTALLED_APPS in its place. Not this app's config (default = False)."""

    default = False
    default_site = "accounts.admin_site.AdminSite"
