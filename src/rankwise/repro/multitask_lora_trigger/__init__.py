"""Reproduction of multitask-lora-trigger (JailbreakLoRA, defender side)."""
