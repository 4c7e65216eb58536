"""Small file helpers shared by operator tools (backup manifests, the ONNX export's manifest)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks (backups and model files are large)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
