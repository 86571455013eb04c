"""Text generation on the exported decoder with its KV cache."""
