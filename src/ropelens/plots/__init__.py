"""Figures of results whose analyses do not import plotly: one module per analysis."""
