"""The experiments of lora-pre: `main`."""
