"""Tests of ``ropelens.testing``."""
