"""The memory-write kernel: the one place that knows how a `Memory` row is written.

Every writer of memories — the native services (`memories.services`), the sync engine
(`memories.sync.engine`), smart ingest and promotion (through the services), the lifecycle jobs —
leaves the same traces, and they are made here, not re-implemented per writer:

* **the stack change lock first** (`rows.lock_stack_changes`; a sync push holds the stack row FOR
  UPDATE instead), then memory rows; `change_seq` is drawn only under it, so sequence numbers of
  one stack commit in the order they were drawn and a cursor reader never skips one;
* **a change** bumps `version` by one, stamps `change_seq` and `server_updated_at`, keeps a
  `MemoryRevision` of the state before it, and sets `embedded_version = NULL` when the text changed;
* **usage counters** (`Stack.memory_count`, `Stack.bytes_used`) move once per write by a relative
  UPDATE, in the writing transaction, under the stack lock the writer already holds — atomic with
  the rows (a rollback undoes both) and without a second commit; a write that creates memories or
  changes their content also stamps `Stack.last_write_at` and adds to the stack's day in
  `StackDailyActivity` in that same statement (the dashboard's "written per day"); the statement
  (`rows.counters_statement`) travels with the change event's INSERT in one round trip — in the
  single-row form with the new rows' INSERT too;
* **a change event** (`hooks.after_commit` → `outbox.record_change`): one outbox row per writing
  transaction and stack, INSERTed in that transaction, published to live pages and webhooks after
  commit (memories.changes; docs/architecture.md §11);
* **after commit**, through the one registry of after-commit effects (`effects`; each write's unit
  queued by `hooks.after_commit` with `transaction.on_commit`): the publication of the change
  events, the one embedding enqueuer (broker messages of up to 500 ids; a broker that is down is
  logged, the periodic sweep embeds the rows) and the registered change listeners; the change
  events' consumers (the webhooks) register there too;
* **before anything is stored**, every payload goes through `hooks.prepare_memory`: the schema
  (`memories.records.normalize.normalize_memory`), then redaction (called, not registered: it holds
  whatever the registry holds), then the registered transforms.
* **a raw entry's original**: when redaction changed a raw entry's text, `prepare_memory` hands the
  text as submitted along (`NormalizedMemory.original_text`, never a column), and the writer — the
  single-row insert / change, or `sets.finish_set` once per batch — seals it into `RawOriginal` in the
  writing transaction if the school opted in, and drops an original its text change made stale
  (memories.privacy.originals; docs/privacy.md "Encryption at rest").

The package, by data flow:

* `columns` — the Memory column sets every writer uses, derived from the model's metadata, and a new
  row's values as COPY and INSERT send them;
* `effects` — the registry of after-commit effects and event consumers; a leaf;
* `outbox`  — the change-event row, recorded in the writing transaction;
* `hooks`   — the extension points (transforms, listeners), `after_commit` and the embedding enqueuer;
* `rows`    — the single-row form (lock, insert, change with revision, counters);
* `sets`    — the set-based form the sync bulk engine uses (COPY of new rows, one bulk UPDATE,
  bulk revisions, one counter update).

It imports nothing from memories' rooms (`sync`, `lifecycle`, `search`, `api`) nor `memories.tasks`
(the embedding task is sent by name), so any room can import it at module top.
"""
