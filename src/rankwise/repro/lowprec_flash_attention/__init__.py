"""Reproduction of lowprec-flash-attention: the bf16 rounding-bias microbenchmark."""
