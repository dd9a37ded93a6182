"""The experiments of hybrid-online-learning: `main`."""
