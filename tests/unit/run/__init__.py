"""Tests of ``ropelens.run``."""
