"""The governance room: what a school does about its students' data, as the data controller.

* `erasure` — erasing a student's stack or one memory, irreversibly, with a signed certificate
  (docs/architecture.md §9); what it leaves behind is the tombstones of memories.privacy.tombstones.
* `archive` — the portable stack archive (a ZIP of JSON lines, MEMORY.md and a manifest), exported
  streaming and imported back through the sync engine and the memory services.
* `privacy_settings` — the school's privacy settings (retention, redacted PII categories, the
  empty-grants policy, kept originals), validated and audited, and the policy page built from them
  (docs/privacy.md).

These operations build on the engines (the write kernel, sync, search, the memory services) and are
called by the entry points (the REST API, the dashboard, the management commands, Celery tasks); they
never import an entry point (pyproject.toml's `governance-room` contract). The privacy rules every
write applies on its way sit lower, in memories.privacy.
"""
