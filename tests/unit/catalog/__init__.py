"""Tests of ``ropelens.cli``."""
