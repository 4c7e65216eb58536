"""The lifecycle room: what happens to memories over time, on the beat schedule.

* `decay`       — the maths (FSRS-style retention, salience, review outcomes); pure functions + SQL twins.
* `decay_pass`  — the set-based pass that stores salience and tombstones what has faded; forgetting candidates.
* `reviews`     — explicit reviews (graded recalls) and the stored-salience side table.
* `ttl`         — the purge of expired memories and old job runs.
* `promotion`   — recurring episode lessons promoted to beliefs.
* `jobs`        — the bookkeeping every job shares: one run at a time (advisory lock), each run recorded.
* `tasks`       — the Celery tasks the beat schedule runs (memoryhub/schedule.py); their registered names
                  (`memories.decay_pass`, …) are fixed by `name=`, whatever the module's path.

Writes to memories go through the write kernel (`memories.writes`); see docs/architecture.md.
"""
