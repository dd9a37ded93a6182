"""Reproduction of CAR-LoRA (card portable-adapter.md): `main.run(size, seed)`."""
