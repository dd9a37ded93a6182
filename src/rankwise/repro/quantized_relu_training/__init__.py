"""The experiments of quantized-relu-training: `main`."""
