"""The figures: one module per analysis, each drawing its results with plotly.

The analyses hold the numbers and import no plotting library; a module here draws one analysis's
results (``ropelens.plots.frequency_usage.usage_figure(u)``). Each analysis's declaration
(``ropelens.catalog``) names its drawing functions by result class and figure name, so
``u.figure()``, ``u.heatmap()`` and Jupyter's display find them; ``style`` holds the look the report
pages give their figures.
"""
