"""The sessions room: an agent's work session turned into memory (docs/algorithms.md §12).

* `cards` — a session in, an episode and its memory card out: the session's allowlisted fields,
  redacted under the school's policy first, then the card derived offline from the redacted text,
  both stored in one batch through the memory services; and the cards a reader may see.

Called by the sessions route (memories.api.sessions) and the student's dashboard page; it builds on
the memory services and the privacy room and imports no entry point.
"""
