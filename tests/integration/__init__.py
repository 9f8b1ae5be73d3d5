"""Integration tests on the real embedded models."""
