"""The privacy room: the privacy rules every memory write and read applies on its way.

* `redaction` — secrets and personal data become typed placeholders before anything is stored or
  derived (docs/algorithms.md §11); the write kernel calls it for every write.
* `originals` — a raw entry's text as submitted, kept only when the school opted in, sealed at rest.
* `grants` — the one predicate builder for what a requester other than the stack's own
  credentials may read (docs/privacy.md "Privacy grants").
* `tombstones` — what an erasure leaves of each erased memory (an id hash only) and the check sync
  makes against it, so an erased record is never pushed back into existence.

The room sits low, under the write kernel, sync and search, which all call it: of `memories` it
imports only the model and the record schema (`memories.records`), never an engine or an entry
point (pyproject.toml's `privacy-room` contract). What a school *does* about its students' data —
erasure, the portable archive, its privacy settings — builds on the engines and lives in
`memories.governance` (docs/architecture.md §3).
"""
