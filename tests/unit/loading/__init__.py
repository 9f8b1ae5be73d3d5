"""Tests of ``ropelens.loading``."""
