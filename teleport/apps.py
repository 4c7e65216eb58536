from django.apps import AppConfig


class TeleportConfig(AppConfig):
    """Workspace snapshots ("teleport"): an agent's tar.gz, checked, cleaned, sealed and stored, and
    the codes that let another agent of the same school fetch it (docs/teleport.md)."""

    name = "teleport"
    default_auto_field = "django.db.models.BigAutoField"
