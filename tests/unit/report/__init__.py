"""Tests of ``ropelens.report``."""
