"""Tests of ``ropelens.analyses``."""
