"""Reproductions of Lorsa: R1 on a toy transformer with planted mechanisms (main), R2 on SmolLM2 (smollm2)."""
