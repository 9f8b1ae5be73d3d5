"""Tests of ``ropelens.training``."""
