"""The sync room: agents push and pull their stacks (docs/kernle-protocol.md §3-§4, §8).

Two wire formats share one engine:

* the **Kernle protocol** (`POST /sync/push`, `POST /sync/pull`) spoken by the real `kernle` CLI:
  per-operation conflicts, an explicit acknowledgement list, a complete change set since the
  client's clock (made safe by a per-credential watermark);
* the **native** API (`/api/v1/stacks/{stack}/sync/…`): batches of up to 1,000 operations with
  per-operation results, and pull by an opaque cursor over the global `change_seq`.

The room, by data flow:

* `protocol` — the wire vocabulary, parsing operations into `SyncOp`s, per-operation results, the
  native cursor, the database clock;
* `lookup`   — the stored rows a batch names, in one query whose plan is checked first;
* `engine`   — applying a batch: the per-operation state machine, the storage quota per operation,
  persisting through the write kernel's set-based form (memories.writes.sets);
* `push`     — the entry points that write: `kernle_push`, `native_push` (and the stack a push
  resolves or provisions);
* `pull`     — the entry points that read: `kernle_pull`, `native_pull`.

Below, the room's public surface — what the views (memories.api.sync) call — and nothing else.
"""

from memories.sync.protocol import NATIVE_PAGE_DEFAULT, NATIVE_PAGE_MAX, PUSH_MAX_OPERATIONS, RECORD_ID_MAX
from memories.sync.pull import kernle_pull, native_pull
from memories.sync.push import kernle_push, native_push

__all__ = ("NATIVE_PAGE_DEFAULT", "NATIVE_PAGE_MAX", "PUSH_MAX_OPERATIONS", "RECORD_ID_MAX", "kernle_pull",
           "kernle_push", "native_pull", "native_push")
