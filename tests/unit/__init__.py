"""Unit tests on tiny random models, one folder per layer of the package."""
