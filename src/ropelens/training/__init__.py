"""Small models trained from scratch under a RoPE variant, or with learned absolute position
embeddings."""
