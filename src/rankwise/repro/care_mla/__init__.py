"""The experiments of care-mla: `main` (one-shot conversion) and `deploy` (the latent-only MLA)."""
