"""All memory routes: the native API under /api/v1/ and the Kernle protocol at the root."""

from __future__ import annotations

from memories.api import (
    access_log,
    archive,
    consent,
    erasure,
    lifecycle,
    memories,
    privacy,
    redaction,
    search,
    sessions,
    sync,
    usage,
)

urlpatterns = (memories.urlpatterns + sync.urlpatterns + search.urlpatterns + lifecycle.urlpatterns
               + archive.urlpatterns + erasure.urlpatterns + redaction.urlpatterns + privacy.urlpatterns
               + sessions.urlpatterns + usage.urlpatterns + access_log.urlpatterns + consent.urlpatterns)
