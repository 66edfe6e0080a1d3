"""A default fit keeps the terminal readable: one progress bar over rounds and nothing else; a default run's
metric that cannot be computed is a blank cell with its reason in the run's log, not a warning."""

import logging
import subprocess
import sys
import warnings
from types import SimpleNamespace

import torch

import dpsbi
from dpsbi.experiment.runner import Scorer

SCRIPT = """
import torch
import dpsbi
torch.set_num_threads(1)  # small flows; two threads on a shared, busy machine wait on each other (20x slower)
task = dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0)
posterior = dpsbi.SPPE(task, rounds=2, sims_per_round=200, training=dict(max_steps=20)).run()
posterior.sample((100,), seed=0)
posterior = dpsbi.SPLE(task, rounds=2, sims_per_round=200, training=dict(max_steps=20)).run()
posterior.sample((100,), seed=0)
"""


def test_a_default_two_round_fit_prints_one_bar_and_no_warning():
    done = subprocess.run([sys.executable, "-W", "default", "-c", SCRIPT], capture_output=True, timeout=600)
    # bytes, not text=True: universal newlines would turn tqdm's "\r" redraws into lines
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 0, output
    lines = [line for line in output.replace("\r", "\n").splitlines() if line.strip()]
    assert "Warning" not in output and "warn" not in output.lower(), output
    for noise in ("GPU available", "litlogger", "Epoch", "Sanity", "LOCAL_RANK"):
        assert noise not in output, noise
    # tqdm redraws one line per update ("\r"): what a terminal keeps is one line per bar
    assert output.count("\n") <= 40, output
    assert all(line.lstrip().startswith(("SPPE rounds", "SPLE rounds")) for line in lines), lines


def test_a_metric_that_cannot_be_computed_is_blank_with_its_reason_in_the_log(caplog):
    """NaiveNPE's collapsed draws (``make run``) have no KDE: NLOG is a blank cell, the reason a line of the
    run's log (dpsbi-run.log), and no warning reaches the terminal."""
    task = dpsbi.tasks.load("conjugate_gaussian")
    score = Scorer(task, SimpleNamespace(samples=None), ["nlog", "lmd"], 100, 0)
    collapsed = task.true_theta.expand(200, -1)
    with warnings.catch_warnings(), caplog.at_level(logging.INFO, logger="dpsbi"):
        warnings.simplefilter("error")
        scores = score(collapsed)
    assert scores["nlog"] is None and scores["lmd"] == scores["lmd"]  # lmd: a number
    (record,) = [r for r in caplog.records if "nlog" in r.getMessage()]
    assert record.levelno == logging.INFO and "singular" in record.getMessage()
    assert torch.isfinite(torch.tensor(score(collapsed + torch.randn(200, 2))["nlog"]))
