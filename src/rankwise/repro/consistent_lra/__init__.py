"""The experiments of consistent-lra: `main`."""
