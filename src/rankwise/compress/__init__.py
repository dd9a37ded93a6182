"""Method packages that compress models: `mla/` (CARE one-shot GQA->MLA), `mla_deploy/` (latent-only MLA)."""
