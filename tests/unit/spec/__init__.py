"""Tests of ``ropelens.spec``."""
