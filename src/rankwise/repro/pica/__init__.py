"""The experiments of pica: `main`."""
