from django.apps import AppConfig
from django.db.backends.signals import connection_created


class MemoryhubConfig(AppConfig):
    name = "memoryhub"

    def ready(self) -> None:
        from memoryhub.database import use_compiled_timestamps

        connection_created.connect(use_compiled_timestamps, dispatch_uid="memoryhub.compiled_timestamps")
