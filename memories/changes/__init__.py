"""The change feed (docs/architecture.md §11): publishing the change events writers record in their
transactions (memories.writes.outbox) to live pages and event consumers, and reading them back.

* `publish`   — after commit: claim, send to the channel layer, hand to the event consumers
  (memories.writes.effects); the relay for what failed, and pruning;
* `publisher` — this process's publisher thread, so a write never waits for publication;
* `watchers`  — who watches a stack's or a school's changes live: the groups worth a send;
* `feed`      — an event as clients see it (`event_dict`), a stack's events after a seq.

It imports the write kernel's registry, never the other way round: the kernel records events,
this room publishes them.
"""
