"""Keep vectors inside the row (search issue).

pgvector's type defaults to EXTERNAL storage, so once a memory row passes ~2 kB (a 384-d vector is
1.5 kB on its own) the vector is moved to the TOAST table and every exact distance computation
pays an extra TOAST lookup: exact search of one stack got ~10x slower. PLAIN keeps the vector
inline (other, compressible columns are toasted instead), as pgvector's README recommends for
exact scans. Metadata-only change: existing rows move as they are rewritten.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("memories", "0003_sync_watermark")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE memories_memory ALTER COLUMN embedding SET STORAGE PLAIN",
            reverse_sql="ALTER TABLE memories_memory ALTER COLUMN embedding SET STORAGE EXTERNAL",
        ),
    ]
