"""Checking and cleaning an uploaded workspace archive (docs/teleport.md "What an upload may hold").

`clean_archive(upload, limit)` reads a tar.gz once, as a stream, and returns a new tar.gz holding
only what a restore may write — regular files and directories under relative paths — plus a report
of what it left out. The rules, one per kind of member:

* **Refused** (the whole upload, `InvalidInput` naming the member and why): a name that is absolute
  or has a `..` component (component-wise: `a..b` is an ordinary name), a symbolic or hard link
  whose target lies outside the archive's root, a device, FIFO or other special file. These only
  appear in archives built to escape the restore directory; keeping the rest would hide that.
* **Stripped** (left out and listed in the report): secret files (`.env`, `id_rsa`, `*.pem`, …,
  `SECRET_NAMES` / `SECRET_SUFFIXES`) and links pointing inside the archive (a restore writes no
  links, so a link could only ever be refused there).
* **Size**: one limit (`settings.TELEPORT_MAX_BYTES`) on the upload and on the bytes the gzip
  stream unpacks to. The unpacked bytes are counted while they stream out of the decompressor and
  reading stops at the limit, so a small archive that unpacks to gigabytes (a zip bomb) costs at
  most `limit` bytes of work and memory before it is refused (`PayloadTooLarge`).

The stored archive is rebuilt, not copied: owners, times and permission bits are normalised
(0644 files, 0755 directories, owner 0, no setuid), so nothing from the uploader's machine but
names and content survives. Nothing here touches Django's database.
"""

from __future__ import annotations

import gzip
import io
import posixpath
import tarfile
import zlib
from dataclasses import dataclass, field
from typing import IO

from memoryhub.errors import InvalidInput, PayloadTooLarge

# Secret files (docs/teleport.md; the teleport scripts' own list plus other SSH and cloud keys).
# Matched on the member's base name, exactly or by suffix, case-insensitively.
SECRET_NAMES = frozenset({
    ".env", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "credentials.json", "client_secret.json",
    ".netrc", ".pgpass", ".npmrc", ".pypirc", ".git-credentials",
})
SECRET_PREFIXES = (".env.",)  # .env.local, .env.production, …
SECRET_SUFFIXES = (".pem", ".key", ".p12", ".pfx")

_READ_CHUNK = 64 * 1024


def is_secret_name(name: str) -> bool:
    base = posixpath.basename(name.rstrip("/")).lower()
    return base in SECRET_NAMES or base.startswith(SECRET_PREFIXES) or base.endswith(SECRET_SUFFIXES)


@dataclass
class CleanArchive:
    data: bytes  # the rebuilt tar.gz
    unpacked_bytes: int  # sum of the kept files' sizes
    file_count: int
    stripped: list[dict[str, str]] = field(default_factory=list)  # [{"name", "reason"}]


class _Unpacked(io.RawIOBase):
    """The decompressed stream of a gzip upload, refusing to yield more than `limit` bytes."""

    def __init__(self, upload: bytes, limit: int) -> None:
        self._gzip = gzip.GzipFile(fileobj=io.BytesIO(upload), mode="rb")
        self._limit = limit
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        # Never ask the decompressor for more than one past the limit: the bomb is stopped there.
        want = min(len(buffer), self._limit + 1 - self.count, _READ_CHUNK)
        if want <= 0:
            raise _TooLarge()
        chunk = self._gzip.read(want)
        self.count += len(chunk)
        if self.count > self._limit:
            raise _TooLarge()
        buffer[:len(chunk)] = chunk
        return len(chunk)


class _TooLarge(Exception):
    pass


def _too_large(limit: int, what: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"The snapshot is larger than {limit:,} bytes {what}.", code="snapshot_too_large",
                           fields={"archive": [f"At most {limit:,} bytes {what}."]})


def _refused(name: str, reason: str) -> InvalidInput:
    return InvalidInput(f"Refused: the archive member {name!r} {reason}; nothing was stored.",
                        code="snapshot_unsafe_member", fields={"archive": [f"{name!r} {reason}."]})


def _relative_name(member: tarfile.TarInfo) -> str:
    """The member's normalised relative path, or a refusal if it is absolute or climbs out."""
    name = member.name
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise _refused(name, "has an absolute path")
    parts = [part for part in name.replace("\\", "/").split("/") if part not in ("", ".")]
    if ".." in parts:
        raise _refused(name, "climbs out of the workspace ('..')")
    return "/".join(parts)


def _link_inside(member: tarfile.TarInfo, name: str) -> bool:
    """Does a link member's target stay inside the archive's root?"""
    target = member.linkname.replace("\\", "/")
    if target.startswith("/") or (len(target) > 1 and target[1] == ":"):
        return False
    # A symlink's target is relative to its own directory, a hard link's to the archive's root.
    base = posixpath.dirname(name) if member.issym() else ""
    resolved = posixpath.normpath(posixpath.join(base, target))
    return resolved not in ("..", ".") and not resolved.startswith("../")


def clean_archive(upload: bytes, *, limit: int) -> CleanArchive:
    """Check `upload` (a tar.gz) member by member and rebuild it from what may be kept (module doc)."""
    if len(upload) > limit:
        raise _too_large(limit, "compressed")
    if not upload.startswith(b"\x1f\x8b"):
        raise InvalidInput("The upload is not a gzip-compressed tar archive (tar.gz).", code="snapshot_not_targz",
                           fields={"archive": ["Expected a tar.gz."]})
    output = io.BytesIO()
    kept = CleanArchive(data=b"", unpacked_bytes=0, file_count=0)
    unpacked = _Unpacked(upload, limit)
    try:
        # mtime=0: the same files give the same stored archive (before sealing).
        with gzip.GzipFile(fileobj=output, mode="wb", mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as out, \
                tarfile.open(fileobj=io.BufferedReader(unpacked, _READ_CHUNK), mode="r|") as tar:
            for member in tar:
                _keep(member, tar, out, kept)
    except _TooLarge:
        raise _too_large(limit, "unpacked") from None
    except (tarfile.TarError, EOFError, OSError, zlib.error, UnicodeError) as exc:
        # gzip.BadGzipFile is an OSError; a truncated stream an EOFError. The type names the fault.
        raise InvalidInput(f"The upload is not a readable tar.gz ({type(exc).__name__}).",
                           code="snapshot_not_targz", fields={"archive": ["Expected a tar.gz."]}) from None
    kept.data = output.getvalue()
    return kept


def _keep(member: tarfile.TarInfo, tar: tarfile.TarFile, out: tarfile.TarFile, kept: CleanArchive) -> None:
    name = _relative_name(member)
    if member.issym() or member.islnk():
        if not _link_inside(member, name):
            raise _refused(member.name, "is a link pointing outside the workspace")
        kept.stripped.append({"name": name, "reason": "link"})
        return
    if not (member.isfile() or member.isdir()):
        raise _refused(member.name, "is a device, FIFO or other special file")
    if not name:  # the root directory itself ("./")
        return
    if is_secret_name(name):
        kept.stripped.append({"name": name, "reason": "secret_file"})
        return  # its content is never read: the stream skips it
    clean = tarfile.TarInfo(name)
    clean.mtime = int(member.mtime) if 0 <= member.mtime < 2**33 else 0
    if member.isdir():
        clean.type, clean.mode = tarfile.DIRTYPE, 0o755
        out.addfile(clean)
        return
    clean.mode = 0o755 if member.mode & 0o100 else 0o644
    source: IO[bytes] | None = tar.extractfile(member)
    content = source.read() if source is not None else b""
    clean.size = len(content)
    out.addfile(clean, io.BytesIO(content))
    kept.file_count += 1
    kept.unpacked_bytes += len(content)
