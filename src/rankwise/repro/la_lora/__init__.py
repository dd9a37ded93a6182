"""Reproduction of LA-LoRA (DP federated LoRA): main.py."""
