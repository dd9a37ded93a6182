"""Reproduction of LMAO (three forwards, one backward): MiniLM few-shot topic classification."""
