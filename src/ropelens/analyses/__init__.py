"""The measurements: one module per analysis, each a reducer (or a function of the spec) and its result.

Corpus analyses (usage, band statistics, heads, sinks, distance, massive values, rotary offsets)
stream windows through :func:`ropelens.run.measure.measure`; the others read the spec (decay, context
extension, base predictors), a single input (decomposition) or run the model under a variant
(passkey). Import the public names from :mod:`ropelens`; this package only groups the modules.
"""
