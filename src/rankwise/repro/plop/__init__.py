"""The experiments of plop: `main`."""
