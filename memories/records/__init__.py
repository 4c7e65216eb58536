"""The records room: what a memory record is, and the one schema every write goes through.

A payload from any writer (the native API, kernle and native sync, smart ingest, promotion,
session cards, archive import) becomes a `NormalizedMemory` here: validated per kind, cleaned,
with its canonical text and stored size. The room imports no other room of `memories`: the write
kernel (`memories.writes`), redaction (`memories.privacy`) and the serializers build on it, never
the other way round (docs/architecture.md §3, §5.1).
"""
