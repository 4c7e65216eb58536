"""The reads room: a stack read as a whole, for an agent's context or a person's eyes.

* `load` — budget-aware load: the memories that fit a character budget, by priority, with the
  latest checkpoint and its warnings (docs/algorithms.md §8).
* `export` — the stack as one MEMORY.md document (docs/algorithms.md §9).
* `usage` — a stack's storage by kind, its growth per month and its projected monthly cost.

They read through the selectors and the privacy grants and edit no memory (load only moves the
access counters of what it served, as bookkeeping). They import no entry point, no sync and no
governance operation (pyproject.toml's `reads-room` contract; the archive in memories.governance
builds on `export`, not the other way round).
"""
