"""Reproductions of martingale-posterior-uq: A (synthetic two-moons deployment) and B (SmolLM2 as the frozen generator)."""
