"""The HTTP service: ONNX Runtime engines behind async batchers. Imports no torch/transformers/optimum."""
