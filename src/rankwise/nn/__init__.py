"""Layers and architectures, one concept per file; every layer is registered in `rankwise.nn.registry`."""
