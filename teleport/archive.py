"""Checking and cleaning an uploaded workspace archive (docs/teleport.md "What an upload may hold").

`clean_archive(upload, limit)` reads a tar.gz once, as a stream, and returns a new tar.gz holding
only what a restore may write — regular files and directories under relative paths — plus a report
of what it left out. The rules, one per kind of member:

* **Member types** are an allow-list: a regular file (`REGTYPE`, `AREGTYPE`), a directory, a
  symbolic or hard link (below). Everything else is refused: devices, FIFOs, GNU sparse files
  (`GNUTYPE_SPARSE`, or a pax header's `GNU.sparse.*`: their header names a `realsize` that the
  reader expands from holes, so 78 bytes of upload unpack to any size), contiguous files,
  volume labels, multi-volume parts and any type tarfile does not know. Pax extended headers and
  GNU long names are not members: tarfile reads them (through the counted stream) as part of the
  member they describe, which is then checked like any other.
* **Refused** (the whole upload, `InvalidInput` `snapshot_unsafe_member` naming the member and
  why): a name that is absolute or has a `..` component (component-wise: `a..b` is an ordinary
  name), a symbolic or hard link whose target lies outside the archive's root, a type not on the
  allow-list. These only appear in archives built to escape the restore directory or to expand on
  the server; keeping the rest would hide that.
* **Stripped** (left out and listed in the report): secret files (`.env`, `id_rsa`, `*.pem`, …,
  `SECRET_NAMES` / `SECRET_SUFFIXES`) and links pointing inside the archive (a restore writes no
  links, so a link could only ever be refused there).
* **Size**: one limit (`settings.TELEPORT_MAX_BYTES`) on the upload, on the bytes the gzip stream
  unpacks to, and on the kept files' content. The unpacked bytes are counted while they stream out
  of the decompressor, and each kept file's bytes while they are copied out of the archive (in
  chunks, never the whole member in memory); a member whose declared size does not fit what is
  left is refused before any of it is read. Reading stops at the limit, so a small archive that
  unpacks to gigabytes (a zip bomb) costs at most `limit` bytes of work and memory before it is
  refused (`PayloadTooLarge`, `snapshot_too_large`).

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
# The allow-list of member types (module doc): anything else is refused. CONTTYPE ('7') is left out
# on purpose although tarfile treats it as a regular file: no workspace tool writes it.
_FILE_TYPES = frozenset({tarfile.REGTYPE, tarfile.AREGTYPE})
_LINK_TYPES = frozenset({tarfile.SYMTYPE, tarfile.LNKTYPE})


def is_secret_name(name: str) -> bool:
    base = posixpath.basename(name.rstrip("/")).lower()
    return base in SECRET_NAMES or base.startswith(SECRET_PREFIXES) or base.endswith(SECRET_SUFFIXES)


@dataclass
class CleanArchive:
    data: bytes  # the rebuilt tar.gz
    unpacked_bytes: int  # sum of the kept files' sizes (at most the limit)
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
                _keep(member, tar, out, kept, limit)
    except _TooLarge:
        raise _too_large(limit, "unpacked") from None
    except (tarfile.TarError, EOFError, OSError, zlib.error, UnicodeError) as exc:
        # gzip.BadGzipFile is an OSError; a truncated stream an EOFError. The type names the fault.
        raise InvalidInput(f"The upload is not a readable tar.gz ({type(exc).__name__}).",
                           code="snapshot_not_targz", fields={"archive": ["Expected a tar.gz."]}) from None
    kept.data = output.getvalue()
    return kept


class _MemberContent:
    """A kept file's content as `TarFile.addfile` copies it out (chunk by chunk), counted against
    what is left of the limit: more than `left` bytes is `_TooLarge`, whatever the header said."""

    def __init__(self, source: IO[bytes], left: int) -> None:
        self._source = source
        self._left = left
        self.count = 0

    def read(self, size: int = _READ_CHUNK) -> bytes:
        if size < 0:  # addfile always asks for a size; "everything" would defeat the bound
            size = _READ_CHUNK
        chunk = self._source.read(min(size, self._left - self.count + 1))
        self.count += len(chunk)
        if self.count > self._left:
            raise _TooLarge()
        return chunk


def _type_refusal(member: tarfile.TarInfo) -> str | None:
    """Why a member's type is not on the allow-list, or None when it is."""
    if member.type == tarfile.GNUTYPE_SPARSE or member.issparse():
        # Checked first: tarfile counts a sparse member as a regular file (isfile() is true).
        return "is a sparse file (its holes would expand on the server); pack it without --sparse"
    if member.type in _FILE_TYPES or member.type in _LINK_TYPES or member.type == tarfile.DIRTYPE:
        return None
    if member.ischr() or member.isblk() or member.isfifo():
        return "is a device, FIFO or other special file"
    return f"has a member type that is not accepted (tar type {member.type.decode('latin-1')!r})"


def _keep(member: tarfile.TarInfo, tar: tarfile.TarFile, out: tarfile.TarFile, kept: CleanArchive,
          limit: int) -> None:
    name = _relative_name(member)
    refusal = _type_refusal(member)
    if refusal:
        raise _refused(member.name, refusal)
    if member.type in _LINK_TYPES:
        if not _link_inside(member, name):
            raise _refused(member.name, "is a link pointing outside the workspace")
        kept.stripped.append({"name": name, "reason": "link"})
        return
    if not name:  # the root directory itself ("./")
        return
    if is_secret_name(name):
        kept.stripped.append({"name": name, "reason": "secret_file"})
        return  # its content is never read: the stream skips it
    clean = tarfile.TarInfo(name)
    clean.mtime = int(member.mtime) if 0 <= member.mtime < 2**33 else 0
    if member.type == tarfile.DIRTYPE:
        clean.type, clean.mode = tarfile.DIRTYPE, 0o755
        out.addfile(clean)
        return
    left = limit - kept.unpacked_bytes
    if member.size > left:  # refused on the header's word, before a byte of it is read
        raise _TooLarge()
    clean.mode = 0o755 if member.mode & 0o100 else 0o644
    clean.size = member.size
    source: IO[bytes] | None = tar.extractfile(member)
    content = _MemberContent(source if source is not None else io.BytesIO(), left)
    # addfile copies exactly clean.size bytes in chunks; a member that ends early is an OSError
    # ("unexpected end of data"): a truncated archive, refused as not a readable tar.gz.
    out.addfile(clean, content)  # tarfile needs only read(size) of it
    kept.file_count += 1
    kept.unpacked_bytes += content.count
