"""Results: the base class every result derives from, files, provenance, findings and display."""
