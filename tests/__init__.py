"""The tests of ropelens."""
