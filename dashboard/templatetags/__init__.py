"""The dashboard's template tags (`consent`)."""
