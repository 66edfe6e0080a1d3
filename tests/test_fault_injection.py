"""Fault injection: damaged posterior, checkpoint and reference-cache files; two runs racing into one
directory. None may load silently, lose or mix anything. These are trials of ``scripts/fault_injection.py``
at small counts; its full report (runs and sweeps killed with SIGKILL at random points, concurrent runs and
sweeps, hundreds of damaged files) is in docs/RESULTS.md. A run killed with SIGKILL and resumed to the
uninterrupted result, and a sweep rerun over its finished points, are tested in tests/test_runs.py (each
``dpsbi-run`` process costs ~10 s of imports, so the kill trials at counts live in the script)."""

import random

import fault_injection as faults  # scripts/ is on the tests' path (pyproject.toml)
import pytest
from faults import DIFFERENT


@pytest.mark.parametrize("trials", [faults.checkpoint_trials, faults.posterior_trials, faults.cache_trials])
def test_damaged_files_are_refused_or_recomputed_never_used(trials, tmp_path):
    counts = trials(tmp_path, random.Random(0), flips=30, truncations=10)
    assert counts[DIFFERENT] == 0 and sum(counts.values()) == 40, counts
    assert counts[faults.IDENTICAL] <= 8, counts  # damage invisible to the reader (archive padding) is rare


def test_two_runs_racing_into_one_directory_never_mix(tmp_path):
    counts = faults.race_trial(tmp_path)
    assert counts["one run, complete and unmixed"] == 1 and counts["1 of 2 refused as busy"] == 1, counts
