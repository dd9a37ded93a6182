"""Reproductions of LRNN (deep low-rank separated networks): image INR against SIREN (`main`), the multiplicative
target against an MLP, a synthetic audio signal, sparse-view CT."""
