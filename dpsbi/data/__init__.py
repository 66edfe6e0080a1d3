"""Data shipped with dpsbi: reference posteriors kept in the repository (``references/``) and the real outbreak
curves with their provenance (``outbreaks/``); each folder's README says what is there."""
