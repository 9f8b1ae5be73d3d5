"""Tests of ``ropelens.plots``."""
