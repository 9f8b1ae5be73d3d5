"""Results: the base class every result derives from, files, provenance, findings, display and where
figures are found."""
