from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The school dashboard: server-rendered pages on the same services and selectors as the API."""

    name = "dashboard"
