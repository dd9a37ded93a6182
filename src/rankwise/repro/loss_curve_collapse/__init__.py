"""Reproduction of loss-curve collapse (Bergsma et al., ICLR 2026)."""
