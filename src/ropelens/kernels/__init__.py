"""Fused device kernels for ropelens's streaming analyses (optional: they need Triton)."""
