"""ropelens's test harness: the family matrix checked against HF's eager attention, the automatic
sweep of every RoPE causal LM in transformers, its shrinking of configs, its checks past the logits
and a dense float64 reference.

It lives beside the tests, not in the installed package: ``ropelens.testing`` keeps only the tiny
models a user's own tests build on. ``scripts/sweep_families.py`` and ``scripts/family_matrix.py``
put the checkout's root on ``sys.path`` to import it.
"""
