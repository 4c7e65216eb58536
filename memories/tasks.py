"""Embedding tasks; filled in by the search issue."""
