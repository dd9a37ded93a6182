"""Matrix, tensor and online-learning algorithms: plain functions and small classes over tensors and arrays."""
