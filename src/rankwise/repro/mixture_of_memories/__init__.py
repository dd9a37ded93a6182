"""Reproduction `mixture-of-memories`: multi-query associative recall, MoM against single-memory linear attention."""
