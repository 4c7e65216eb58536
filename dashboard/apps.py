from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The school dashboard: server-rendered pages on the same services and selectors as the API."""

    name = "dashboard"

    def ready(self) -> None:
        # Close live sockets when a session ends or access is removed.
        from dashboard import live

        live.connect_signals()
