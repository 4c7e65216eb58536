"""A row read through a written-out statement becomes the memory the ORM would read
(memoryhub.database.ModelRows, docs/architecture.md §7.2): JSON columns included, which are parsed
by orjson there and by the standard library in the ORM."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from memories.models import Memory
from memories.selectors import MEMORY_ROWS
from tests.factories import make_org, make_stack

pytestmark = pytest.mark.django_db

DATA = {
    "content": "Fractions: ½ + ¼ = ¾, explained with pizza 🍕",
    "nested": {"list": [1, 2.5, -3e-7, True, None, "x"], "empty": {}, "quote": 'say "hi"\n'},
    # Past 64 bits: orjson would read them as floats, the ORM's parser keeps them exact.
    "large": 2**70 + 1,
    "negative_large": -(2**65) - 1,
    "digits_in_text": "call 1234567890123456789012",
    "float": 0.1 + 0.2,
}


def _read_through_rows(memory: Memory) -> Memory:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {MEMORY_ROWS.columns} FROM {MEMORY_ROWS.table} WHERE m.id = %s",  # noqa: S608
                       [memory.pk])
        row = cursor.fetchone()
    assert row is not None
    return MEMORY_ROWS.instance(row)


def test_a_memory_read_through_rows_has_the_json_values_the_orm_reads() -> None:
    stack = make_stack(make_org())
    memory = Memory.objects.create(stack=stack, kind="note", record_id="json-values", text="fractions",
                                   data=DATA, extra={"client": ["kernle", 0.15]},
                                   written_by=[{"by": "key:abc123", "path": "api"}],
                                   created_at=timezone.now(), server_updated_at=timezone.now())
    through_orm = Memory.objects.get(pk=memory.pk)

    through_rows = _read_through_rows(memory)

    for name in ("data", "extra", "written_by", "redaction_report"):
        assert getattr(through_rows, name) == getattr(through_orm, name), name
    assert through_rows.data == DATA
    assert type(through_rows.data["large"]) is int and type(through_rows.data["float"]) is float


def test_a_json_string_or_number_at_the_top_comes_back_as_the_orm_reads_it() -> None:
    stack = make_stack(make_org())
    memory = Memory.objects.create(stack=stack, kind="note", record_id="json-scalars", text="scalars",
                                   data="just text", extra=12345678901234567890123,
                                   created_at=timezone.now(), server_updated_at=timezone.now())
    through_rows = _read_through_rows(memory)
    assert through_rows.data == "just text"
    assert through_rows.extra == 12345678901234567890123 and type(through_rows.extra) is int
