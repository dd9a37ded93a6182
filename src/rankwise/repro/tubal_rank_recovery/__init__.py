"""The experiments of tubal-rank-recovery: `main`."""
