"""The records, one file per family."""
