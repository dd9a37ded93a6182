"""Vision domain methods: `apps/vision/<slug_>/` (EMAC-AUTTA's active universal test-time adaptation, ...)."""
