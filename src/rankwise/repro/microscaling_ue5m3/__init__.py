"""The experiments of microscaling-ue5m3: `main`."""
