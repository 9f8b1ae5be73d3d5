"""Plotly figures drawn from ropelens results (the analyses compute; these draw)."""
