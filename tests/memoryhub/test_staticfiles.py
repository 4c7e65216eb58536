"""collectstatic's compression step (memoryhub/staticfiles.py): a file compressed by an earlier run
is not compressed again at the next `make run` start, and a file whose source changed is."""

from __future__ import annotations

import os
from pathlib import Path

import brotli

from memoryhub.staticfiles import ManifestOrSourceStorage

SCRIPT = "console.log('the dashboard');\n" * 200  # compresses well: WhiteNoise keeps a .br copy


def _compressed(storage: ManifestOrSourceStorage, *names: str) -> set[str]:
    return {compressed for _, compressed in storage.compress_files(list(names))}


def test_a_file_compressed_before_is_skipped_and_a_changed_one_is_compressed_again(tmp_path: Path) -> None:
    storage = ManifestOrSourceStorage(location=str(tmp_path), base_url="/static/")
    script = tmp_path / "app.js"
    script.write_text(SCRIPT)

    assert _compressed(storage, "app.js") == {"app.js.br", "app.js.gz"}  # the first run compresses
    assert _compressed(storage, "app.js") == set()  # the next start: nothing to do

    # collectstatic rewrote the file (its source changed): a new mtime, so compressed again.
    script.write_text(SCRIPT.replace("dashboard", "overview"))
    later = os.stat(script).st_mtime + 5
    os.utime(script, (later, later))
    assert _compressed(storage, "app.js") == {"app.js.br", "app.js.gz"}
    assert brotli.decompress((tmp_path / "app.js.br").read_bytes()).decode() == script.read_text()
