"""HF model directories -> ONNX variants behind a parity gate -> a versioned model repository."""
