"""The run: data, streaming capture, the probe, measurement over a corpus (one process or many),
losses, interventions."""
