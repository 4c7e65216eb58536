"""The checks a pattern match must also pass before it counts (docs/algorithms.md §11): a card
number's Luhn digit and separators, a word after `Bearer` that looks like a credential rather than
prose, a JWT's header, a bare base64 run that decodes to a private key's structure (DER: PKCS#1,
SEC1, PKCS#8, PKCS#12; OpenPGP secret-key packets; OpenSSH), and national phone numbers that Google's
libphonenumber (`phonenumbers`) accepts as valid, so dates, scores and version numbers are left alone.
Pure functions of a string; the rules that call them are in `memories.privacy.redaction.rules`.
"""

from __future__ import annotations

import base64
import binascii
import re

import phonenumbers

from memories.privacy.redaction.folding import Span


def _luhn(candidate: str) -> bool:
    digits = [int(c) for c in candidate if c.isdigit()]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for i, digit in enumerate(reversed(digits)):
        if i % 2:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


_CARD_SEPARATORS = re.compile(r"[ ./\-]")


def card_number(candidate: str) -> bool:
    """Luhn, and with dots or slashes (`4111.1111.1111.1111`) one separator throughout between
    groups of 3+ digits, so a run of dotted numbers is not read as a card."""
    if not _luhn(candidate):
        return False
    separators = set(_CARD_SEPARATORS.findall(candidate))
    if separators & {".", "/"}:
        return len(separators) == 1 and all(len(group) >= 3 for group in _CARD_SEPARATORS.split(candidate))
    return True


def token_like(token: str, minimum: int = 8) -> bool:
    """Whether a word after `Bearer` (or an auth scheme) is a credential rather than prose: a digit,
    a token symbol or base64 padding, mixed case inside the word, or a length no English word has."""
    core = token.rstrip("=")
    if len(core) < minimum:
        return False
    if core != token or any(c.isdigit() or c in "_~+/" for c in core):
        return True
    if sum(c.isupper() for c in core[1:]) >= 2 and sum(c.islower() for c in core) >= 2:
        return True
    return len(core) >= 24 or (len(core) >= 20 and ("-" in core or "." in core))


def jwt_header(token: str) -> bool:
    """A JWT's first segment is a JSON object with an `alg`: `eyJ` is `{"` in base64url; another
    start (`{ "`, `{\\n`) is decoded to check."""
    if token.startswith("eyJ"):
        return True
    header = token.split(".", 1)[0].rstrip("=")
    try:
        raw = base64.urlsafe_b64decode(header + "=" * (-len(header) % 4))
    except (binascii.Error, ValueError):
        return False
    return raw.lstrip().startswith(b"{") and b'"alg"' in raw


# Private keys without their header: the base64 run must decode to the start of a key structure.
_PBE_OIDS = (bytes.fromhex("2a864886f70d0105"), bytes.fromhex("2a864886f70d010c01"))  # PKCS#5 / PKCS#12 PBE
_PGP_ALGORITHMS = frozenset({1, 2, 3, 16, 17, 18, 19, 20, 22, 25, 26, 27, 28})


def _der_length(raw: bytes, index: int) -> tuple[int, int] | None:
    """(length, index after it) of the DER length at `index`."""
    if index >= len(raw):
        return None
    first = raw[index]
    if first < 0x80:
        return first, index + 1
    size = first & 0x7F
    if not 1 <= size <= 3 or index + 1 + size > len(raw):
        return None
    return int.from_bytes(raw[index + 1:index + 1 + size], "big"), index + 1 + size


def _der_private_key(raw: bytes) -> bool:
    """PKCS#1 (RSA, DSA), SEC1 (EC), PKCS#8 (plain or encrypted) or PKCS#12: a SEQUENCE whose first
    element is the version INTEGER followed by the key or its algorithm, or an encryption
    AlgorithmIdentifier. A certificate, a public key or a signature starts otherwise."""
    if raw[:1] != b"\x30":
        return False
    outer = _der_length(raw, 1)
    if outer is None or outer[0] < 40:
        return False
    index = outer[1]
    inner = raw[index:index + 4]
    if inner[:3] in (b"\x02\x01\x00", b"\x02\x01\x01") and inner[3:4] in (b"\x02", b"\x04", b"\x30"):
        return True
    if inner == b"\x02\x01\x03\x30":  # PKCS#12 (PFX, version 3)
        return True
    if inner[:1] != b"\x30":
        return False
    algorithm = _der_length(raw, index + 1)
    if algorithm is None or raw[algorithm[1]:algorithm[1] + 1] != b"\x06":
        return False
    oid = _der_length(raw, algorithm[1] + 1)
    return oid is not None and raw[oid[1]:oid[1] + oid[0]].startswith(_PBE_OIDS)


def _pgp_secret_key(raw: bytes) -> bool:
    """An OpenPGP secret-key packet (tag 5, old or new format) with a known version and algorithm."""
    if len(raw) < 12:
        return False
    tag = raw[0]
    if tag == 0xC5:
        first = raw[1]
        index = 2 if first < 192 else 3 if first < 224 else 6 if first == 255 else 0
        if not index:
            return False
    elif tag & 0xFC == 0x94:
        index = 1 + (1, 2, 4, 0)[tag & 3]
    else:
        return False
    version = raw[index]
    algorithm_at = index + (7 if version == 3 else 5)
    return version in (3, 4, 5, 6) and algorithm_at < len(raw) and raw[algorithm_at] in _PGP_ALGORITHMS


def private_key_body(run: str) -> bool:
    compact = "".join(run.split()).rstrip("=")
    if len(compact) < 60:
        return False
    head = compact[:64]
    try:
        raw = base64.b64decode(head[:len(head) // 4 * 4])
    except (binascii.Error, ValueError):
        return False
    return raw.startswith(b"openssh-key-v1\x00") or _pgp_secret_key(raw) or _der_private_key(raw)


# Phone numbers in national form (UK, Germany) are candidates that the phone-number library must
# accept as a valid number; dates in the same shape (`03.04.2024`, valid German numbers) and runs of
# two-digit groups are left alone.
_PHONE_CANDIDATE = re.compile(
    r"(?<![\w+.])(?:(?:\+|00)[1-9]\d{0,2}[ ./\-]?(?:\(0\)[ ./\-]?)?|\(0\d{1,4}\)[ ./\-]?|0(?=\d))"
    r"\d(?:[ ./\-]?\d){5,13}(?!\d)")
_DATE_SHAPE = re.compile(r"\d{1,2}([./\-])\d{1,2}\1\d{2,4}")
_PHONE_GROUPS = re.compile(r"\d+")
PHONE_REGIONS = ("GB", "DE")


def library_phones(text: str) -> list[Span]:
    spans = []
    for match in _PHONE_CANDIDATE.finditer(text):
        candidate = match.group(0)
        groups = _PHONE_GROUPS.findall(candidate)
        if _DATE_SHAPE.fullmatch(candidate) or (len(groups) > 1 and max(map(len, groups[1:])) < 3):
            continue
        if _valid_phone(candidate):
            spans.append(match.span())
    return spans


def _valid_phone(candidate: str) -> bool:
    for region in PHONE_REGIONS:
        try:
            number = phonenumbers.parse(candidate, region)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(number):
            return True
    return False
