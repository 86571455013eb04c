"""Teacher -> student distillation (PyTorch, HF transformers). Knows nothing of ONNX or HTTP."""
