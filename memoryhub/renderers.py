"""The API's JSON renderer: DRF's JSONRenderer, with the encoding done by orjson.

WHY: DRF encodes with the standard library's `json` and a Python `default()` hook for every
datetime, UUID and decimal in a response. On the soak's mix (bench/soak.py) that was the largest
single piece of Python work in a response after the database, and orjson does the same work in a
small fraction of the time.

The bytes are the same as DRF's for everything the API sends: compact separators, UTF-8 (not
\\u-escaped), datetimes as ISO 8601 with `Z` for UTC, UUIDs as strings, U+2028 / U+2029 escaped (as
DRF does, so the output stays a JavaScript subset). Anything orjson does not know (lazy translation
strings, decimals, durations, …) goes through DRF's own encoder hook; anything it refuses outright
(an integer beyond 64 bits, a string holding a lone surrogate) and any request for indented output
(`Accept: application/json; indent=4`) is rendered by DRF's renderer itself, exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder

_OPTIONS = orjson.OPT_UTC_Z | orjson.OPT_NON_STR_KEYS
_LINE_SEPARATORS = b"\xe2\x80\xa8", b"\xe2\x80\xa9"  # U+2028, U+2029 in UTF-8
_default = JSONEncoder().default


class FastJSONRenderer(JSONRenderer):
    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: Mapping[str, Any] | None = None) -> bytes:
        if data is None:
            return b""
        if not self.compact or self.ensure_ascii or self.get_indent(accepted_media_type or "", renderer_context or {}):
            return super().render(data, accepted_media_type, renderer_context)
        try:
            rendered = orjson.dumps(data, default=_default, option=_OPTIONS)
        except TypeError:  # orjson.JSONEncodeError: DRF renders it (or fails) exactly as it always did
            return super().render(data, accepted_media_type, renderer_context)
        if b"\xe2\x80" in rendered:
            rendered = rendered.replace(_LINE_SEPARATORS[0], b"\\u2028").replace(_LINE_SEPARATORS[1], b"\\u2029")
        return rendered
