"""Leave room for one more row version on every memories page: fillfactor 85 -> 75 (issue 19).

0006 set 85 so that a load's access-count UPDATE (times_accessed / last_accessed, not indexed)
could stay on its page as a HOT update. 0007 then kept the ~1.5 kB vector and the tsvector inside
the row, which made a typical row ~2.2 kB: three of them fit under 85 % of an 8 kB page, and the
~1.4 kB left is too little for a new version of any of them. So most access updates moved the row
and added an entry to every index of the table, the HNSW graph included — under the soak the
load's UPDATE was about a third of PostgreSQL's CPU. At 75 a page takes two such rows and keeps
~3.7 kB free, enough for one new version at a time (pruned on the page's next visit).

Measured (a copy of the table's shape, 3,000 rows of 20 stacks, 10 loads of 150 rows per stack):
HOT for 81 % of the access updates at 85, 92 % at 75; the access UPDATE's p50 58-112 ms at
80-100 against 1-8 ms at 75 (a busy box, three runs). Cost: the heap is ~1.13x larger than at 85. Applies to pages written from now on (every embedded
row is rewritten once by the embedder, so new rows get the room); VACUUM FULL applies it to old
pages. To take it out: `ALTER TABLE memories_memory SET (fillfactor = 85)`.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("memories", "0018_raw_original"),
    ]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE memories_memory SET (fillfactor = 75)",
            reverse_sql="ALTER TABLE memories_memory SET (fillfactor = 85)",
        ),
    ]
