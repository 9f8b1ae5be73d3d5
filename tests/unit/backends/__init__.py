"""Tests of ``ropelens.backends``."""
