"""Static files, served by the ASGI app itself (WhiteNoise) in every mode.

`make run` collects them (`collectstatic`, after migrate, before the web server starts) into
DATA_DIR/staticfiles: every file gets a content-hashed copy (cache-busting: the hashed URL may be
cached forever) and gzip/brotli siblings. A process whose STATIC_ROOT holds no manifest yet — the
test session, `manage.py runserver` before the first `make run`, a deployment that skipped
collectstatic — serves the same files straight from the source directories (WhiteNoise's
finders, see WHITENOISE_USE_FINDERS in settings) under their plain names, so a page never breaks
for want of a collectstatic run; it is only not cache-busted.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import brotli
from django.conf import settings
from whitenoise.compress import Compressor
from whitenoise.middleware import WhiteNoiseMiddleware
from whitenoise.storage import CompressedManifestStaticFilesStorage


class _Compressor(Compressor):
    """WhiteNoise's compressor with brotli at quality 9 instead of 11.

    collectstatic runs at every `make run` start. At quality 11 brotli is many times slower for a
    file only slightly smaller; quality 9 is still smaller than gzip -9.
    """

    @staticmethod
    def compress_brotli(data: bytes) -> bytes:
        return bytes(brotli.compress(data, quality=9))


class ManifestOrSourceStorage(CompressedManifestStaticFilesStorage):
    """Hashed, compressed names once collected; the plain source name before that.

    Stock manifest storage raises "Missing staticfiles manifest entry" for every `{% static %}`
    when nothing was collected, which turns every page into a 500.
    """

    def create_compressor(self, **kwargs: Any) -> Compressor:
        return _Compressor(**kwargs)

    def compress_files(self, paths: Iterable[str]) -> Iterator[tuple[str, str]]:
        """WhiteNoise's compression, minus the files an earlier collectstatic compressed already.

        Compression was most of a collectstatic over an unchanged tree, at every `make run` start
        (docs/configuration.md, MEMORYHUB_STATIC_ROOT). WhiteNoise gives each compressed copy its
        source's mtime, and collectstatic rewrites a collected file (new mtime) only when its source
        changed, so a `.br` beside a file with the same mtime is that file's. Files compression did
        not shrink enough have no copy and are tried again (cheap: they are few and small)."""
        return super().compress_files([path for path in paths if not self._compressed_already(path)])

    def _compressed_already(self, path: str) -> bool:
        full_path = self.path(path)
        try:
            mtime = os.stat(full_path).st_mtime
            return any(os.stat(full_path + suffix).st_mtime == mtime for suffix in (".br", ".gz"))
        except FileNotFoundError:
            return False

    def stored_name(self, name: str) -> str:
        if not self.hashed_files and not self.manifest_hash:  # no manifest was loaded
            return name
        return str(super().stored_name(name))


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise, without its "No directory at" warning for a STATIC_ROOT not collected yet:
    the finders serve then (settings turn them on exactly when nothing was collected)."""

    files: dict[str, Any]  # WhiteNoise's index: URL -> the file to serve
    # The finders' files as WhiteNoise indexes them, per process and configuration (see below).
    _indexed_from_finders: ClassVar[dict[tuple[Any, ...], dict[str, Any]]] = {}

    def add_files(self, root: Any, prefix: str | None = None) -> None:
        if self.use_finders and not os.path.isdir(root):
            return
        super().add_files(root, prefix)

    def add_files_from_finders(self) -> None:
        """WhiteNoise's index of the source files, built once per process instead of once per
        middleware instance. Only a process serving from source uses it (the test session, a bare
        runserver; `make run` serves what it collected), and there every Django test client builds
        the middleware anew, and indexing the source files was most of what a hostile-input test
        of one route took. The index is of the files as they were at the first build, as it was per
        instance (WhiteNoise does not look again until restarted, unless WHITENOISE_AUTOREFRESH)."""
        key = (self.static_prefix, self.max_age, self.charset, self.allow_all_origins,
               repr(settings.STATICFILES_DIRS))
        indexed = self._indexed_from_finders.get(key)
        if indexed is None:
            kept, self.files = self.files, {}
            try:
                super().add_files_from_finders()
                indexed = self._indexed_from_finders[key] = self.files
            finally:
                self.files = kept
        self.files.update(indexed)

