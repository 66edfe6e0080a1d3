"""Data shipped with dpsbi: reference posteriors kept in the repository (``references/``, see its README)."""
