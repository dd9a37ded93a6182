"""The experiments of escape-directions: `main`."""
