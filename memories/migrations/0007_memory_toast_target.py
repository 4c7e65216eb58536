"""Keep a memory's tsvector inside the row (search latency, issue 6).

With the embedding stored PLAIN (0004) a memory row is ~2.5 kB, above the default
toast_tuple_target (~2 kB), and Postgres moved the largest compressible column - the generated
`search_vector` - out to the TOAST table. Every `search_vector @@ query` and `ts_rank` of the
keyword leg then paid a TOAST index lookup and a decompression per row (bench copy of one stack:
keyword leg 2.6 ms / 900 rows and 52 ms / 10,000 rows toasted vs 1.2 / 27 ms inline).

MAIN storage makes the tsvector the last column to leave the row, so `text`, `data` and `extra`
go to TOAST first (only the ~10 final hits read them); the 2300-byte target lets a typical row
(fixed columns + 1.5 kB vector + tsvector ≈ 2.2 kB) stay whole, while still fitting three rows
per page so the exact vector scan reads no more pages than before. Metadata-only: rows written
from now on are laid out this way, existing ones as they are rewritten.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("memories", "0006_memory_fillfactor"),
    ]

    operations = [
        migrations.RunSQL(
            [
                "ALTER TABLE memories_memory ALTER COLUMN search_vector SET STORAGE MAIN",
                "ALTER TABLE memories_memory SET (toast_tuple_target = 2300)",
            ],
            reverse_sql=[
                "ALTER TABLE memories_memory RESET (toast_tuple_target)",
                "ALTER TABLE memories_memory ALTER COLUMN search_vector SET STORAGE EXTENDED",
            ],
        ),
    ]
