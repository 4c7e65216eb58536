"""memoryhub/staticfiles.py: collectstatic's compression step (a file compressed by an earlier run
is not compressed again at the next `make run` start, a file whose source changed is) and the
index of source files a process without collected files serves from."""

from __future__ import annotations

import os
from pathlib import Path

import brotli
from django.test import RequestFactory

from memoryhub.staticfiles import ManifestOrSourceStorage, StaticFilesMiddleware

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


def test_a_process_serving_from_source_indexes_the_source_files_once() -> None:
    """Every Django test client builds the middleware anew; the index of the source files is
    built by the first and shared by the next, which serves the same files."""
    first = StaticFilesMiddleware(get_response=lambda request: None)
    second = StaticFilesMiddleware(get_response=lambda request: None)
    assert first.use_finders, "this test session serves static files from source"
    url = "/static/dashboard/live.js"
    assert first.files[url] is second.files[url]  # the same index entry, not a second scan
    response = second(RequestFactory().get(url))
    assert response.status_code == 200
    assert b"".join(response.streaming_content).startswith(b"// MemoryHub live dashboard")
