"""The building blocks of a Transformer: embeddings, norms, rotary, attention, MLP, block."""
