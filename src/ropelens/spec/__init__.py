"""The spec: RoPE math (LayerRope, RopeSpec), reading it from a running model, bands, variants and
the plan in force."""
