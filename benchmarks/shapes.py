"""Model shapes the benchmarks build with random weights: their speed is the point, and there is no hub."""

from __future__ import annotations

# all-MiniLM-L6-v2's encoder (6 x 384, 12 heads) with BERT's uncased vocabulary: a realistic student.
MINILM_BERT_CONFIG: dict[str, int] = {
    "vocab_size": 30522,
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "max_position_embeddings": 512,
}
