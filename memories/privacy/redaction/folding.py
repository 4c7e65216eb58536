"""What the redaction rules see: each string NFKC-normalised, its invisible characters removed, and
the way back from a match in that folded text to the characters that were sent.

Fullwidth letters and digits, ligatures and no-break spaces become their plain forms; zero-width
space / joiners, word joiner, BOM and soft hyphen (`_INVISIBLE`) are dropped, so a secret cannot hide
behind them. `fold` is for the cheap pre-checks (no map back); `fold_mapped` keeps, per folded
character, the original characters it came from, so `substitute` replaces only what matched and
the rest of the text is stored exactly as sent. ASCII text is its own fold and costs nothing more.
docs/algorithms.md §11; the package docstring (memories.privacy.redaction) has the whole contract.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

Span = tuple[int, int]


# Characters that render as nothing and so can split a secret unseen: zero-width space, non-joiner
# and joiner, word joiner, the invisible operators, the BOM / zero-width no-break space, the soft
# hyphen and the Mongolian vowel separator.
_INVISIBLE = dict.fromkeys(map(ord, "\u00ad\u180e\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff"))


def fold(text: str) -> str:
    """`text` as the rules see it (module docstring), for the pre-checks: no map back."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFKC", text.translate(_INVISIBLE))


@dataclass(frozen=True)
class Folded:
    text: str  # what the rules see
    origin: list[Span] | None  # per character of `text`, the original characters it came from; None: the same


def fold_mapped(text: str) -> Folded:
    """`text` folded (module docstring) with the map back to its characters. NFKC is applied per
    character and the combining marks that follow it, so every folded character knows its source."""
    if text.isascii():
        return Folded(text, None)
    if len(text.translate(_INVISIBLE)) == len(text) and unicodedata.is_normalized("NFKC", text):
        return Folded(text, None)
    pieces: list[str] = []
    origin: list[Span] = []
    index, size = 0, len(text)
    while index < size:
        if ord(text[index]) in _INVISIBLE:
            index += 1
            continue
        end = index + 1
        while end < size and unicodedata.combining(text[end]):
            end += 1
        piece = text[index:end]
        if not piece.isascii():
            piece = unicodedata.normalize("NFKC", piece)
        pieces.append(piece)
        origin.extend([(index, end)] * len(piece))
        index = end
    return Folded("".join(pieces), origin)


def substitute(text: str, folded: Folded, spans: list[Span], placeholder: str) -> tuple[str, int]:
    """`text` with the folded `spans` (in order, not overlapping) replaced by `placeholder`; how many."""
    if folded.origin is not None:
        spans = [(folded.origin[start][0], folded.origin[end - 1][1]) for start, end in spans]
    parts: list[str] = []
    last = hits = 0
    for start, end in spans:
        if start < last:  # two folded matches inside one original character (a ligature): one placeholder
            continue
        parts += (text[last:start], placeholder)
        last = end
        hits += 1
    parts.append(text[last:])
    return "".join(parts), hits
