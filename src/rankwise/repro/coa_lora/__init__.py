"""CoA-LoRA's reproduction: MiniLM's top layers quantized per configuration, wiki-topics, held-out configurations."""
