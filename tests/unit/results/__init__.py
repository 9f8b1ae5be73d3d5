"""Tests of ``ropelens.results``."""
