"""Hot statements prepared once per database session and run with a generic plan
(docs/algorithms.md §7.5 "Cost", §8.4).

For a statement whose parsing and planning cost more than running it, and whose plan is the same
whatever its values, `fetch_prepared` sends `PREPARE` the first time a database session runs it and
`EXECUTE` from then on. PostgreSQL's plan cache would keep choosing a fresh plan per call (a
per-call plan knows the values, so its estimate always wins), and only a generic plan skips the
planning: hence `SET LOCAL plan_cache_mode = force_generic_plan`, for that transaction only.
PREPARE, the settings and EXECUTE go in one round trip.

A caller runs the plain statement when this returns None: `DB_PREPARED_STATEMENTS=false` (a
transaction-pooling PgBouncer does not carry one session's PREPARE to the next transaction), or a
session that already holds MAX_PREPARED_PER_SESSION statements.
"""

from __future__ import annotations

import itertools
import re
from typing import Any
from weakref import WeakKeyDictionary

from django.conf import settings
from django.db import connection

# The statements this process has prepared, by database session (the driver's connection object: a
# session's prepared statements end with it, and a new session is a new object) and text.
_PREPARED: WeakKeyDictionary[Any, dict[str, tuple[str, list[str]]]] = WeakKeyDictionary()
# Callers prepare a few dozen shapes at most (a search's filters x privacy grants, a load's grants);
# past this many, a session runs further shapes unprepared rather than keep plans without bound.
MAX_PREPARED_PER_SESSION = 64
_STATEMENT_NAMES = itertools.count()  # unique per process: a failed first run never reuses a name
_NAMED_PARAMETER = re.compile(r"%\((\w+)\)s")


def fetch_prepared(cursor: Any, sql: str, params: dict[str, Any], *, name: str,
                   settings_sql: str = "") -> list[tuple[Any, ...]] | None:
    """The rows of `sql` (the driver's named parameters, as the plain statement would be sent) run
    as a statement prepared once per database session (see the module doc), or None: run it plain.
    `name` starts the prepared statement's name (`<name>_<n>`); `settings_sql` ("SET LOCAL …;")
    starts the string, so the plan is made, and remade after an invalidation, under it."""
    if not settings.DB_PREPARED_STATEMENTS:
        return None
    statements = _PREPARED.setdefault(connection.connection, {})
    known = statements.get(sql)
    prepare = ""
    if known is None:
        if len(statements) >= MAX_PREPARED_PER_SESSION:
            return None
        names = list(dict.fromkeys(_NAMED_PARAMETER.findall(sql)))
        positional = _NAMED_PARAMETER.sub(lambda found: f"${names.index(found.group(1)) + 1}", sql)
        known = (f"{name}_{next(_STATEMENT_NAMES)}", names)
        # Sent through the driver's parameter binding like the plain statement: its literal % are
        # doubled already.
        prepare = f"PREPARE {known[0]} AS {positional};"
    statement, names = known
    cursor.execute(f"{settings_sql}{prepare}SET LOCAL plan_cache_mode = force_generic_plan;"
                   f"EXECUTE {statement}({', '.join(['%s'] * len(names))})", [params[n] for n in names])
    while cursor.nextset():  # to the EXECUTE's rows, the last result
        pass
    rows = list(cursor.fetchall())
    statements[sql] = known  # only once it ran: a statement that failed is prepared again, by a new name
    return rows
