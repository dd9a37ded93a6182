"""The experiments of guardspace: `main`."""
