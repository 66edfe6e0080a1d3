"""A default fit keeps the terminal readable: one progress bar (its round, elapsed and expected remaining time) and
nothing else; a default run's metric that cannot be computed is a blank cell with its reason in the run's log, not a warning."""

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
    assert all(line.lstrip().startswith(("SPPE fit", "SPLE fit")) for line in lines), lines
    # the bar ends on the fit's round and elapsed time, with no estimate left
    assert lines[-1].rstrip().endswith("elapsed") and "round 2/2" in lines[-1], lines


def test_progress_false_prints_nothing(capfd):
    """No bar, no line and no warning from a fit with ``progress=False`` (in process: the subprocess above checks
    the bar)."""
    task = dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dpsbi.SPPE(task, rounds=2, sims_per_round=100, training=dict(max_steps=5), progress=False).run()
    out, err = capfd.readouterr()
    assert out + err == "" and not caught, (out, err, [str(w.message) for w in caught])


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


def test_the_estimate_counts_the_steps_every_round_takes_and_prices_unrun_kinds_by_the_probe():
    """The plan made at the first round's training is the steps the later rounds take (fixed by the settings);
    SPPE's atomic rounds are another kind of step, priced by the probe's ratio to the measured first round."""
    from dpsbi.inference.progress import FitProgress

    task = dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0)
    settings = dict(rounds=3, sims_per_round=230, training=dict(max_steps=30, patience=10**6), progress=False)
    estimator = dpsbi.SPPE(task, **settings)
    plan = estimator.planned_rounds(0, 230 - 12)  # 12 = round(0.05 * 230) validation rows
    estimator.run()
    assert plan == [(1, estimator.history[1]["steps"]), (2, estimator.history[2]["steps"])]
    assert estimator.step_work(1) == 10 * estimator.step_work(0)  # 10 atoms
    progress = FitProgress(estimator, 0, False)  # learns the finished rounds' rates from history
    first, atomic = estimator.step_work(0), estimator.step_work(1)
    progress.measured = {first: 0.01}
    progress.probed = {first: 0.002, atomic: 0.009}
    assert abs(progress.seconds_per_step(1) - 0.045) < 1e-12


def test_a_round_s_rate_leaves_out_its_first_epoch(monkeypatch):
    """A compiled round spends its first epoch's first steps compiling: the rate that prices the steps left is
    measured after that epoch, and kept when the round ends (its training seconds over its steps would put the
    compiling into every later round's steps)."""
    from dpsbi.inference import progress as module

    task = dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0)
    estimator = dpsbi.SPPE(task, rounds=2, sims_per_round=230, amortized=True, progress=False)
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(module.time, "perf_counter", lambda: clock.now)
    progress = module.FitProgress(estimator, 0, False)
    progress.begin_round(0)
    progress.begin_training(2000)  # per_epoch: the batches of 2000 rows at the fit's batch size
    per_epoch, kind = progress.per_epoch, progress.work(0)
    clock.now = 100.0 + per_epoch * 0.01  # the first epoch: 100 s of compiling, then steps of 10 ms
    progress.epoch(1, 0.0, 0.0)
    assert abs(progress.measured[kind] - clock.now / per_epoch) < 1e-9
    clock.now += 2 * per_epoch * 0.01
    progress.epoch(3, 0.0, 0.0)
    assert abs(progress.measured[kind] - 0.01) < 1e-9
    entry = {"round": 1, "steps": 3 * per_epoch, "seconds": clock.now + 5.0}
    progress.end_round(entry)
    assert abs(progress.measured[kind] - 0.01) < 1e-9  # not (100 + steps) / steps
    assert abs(progress.other[True] - 5.0) < 1e-9
    estimator.history = [entry]  # a resumed fit prices its steps as the round measured them
    assert abs(module.FitProgress(estimator, 1, False).measured[kind] - 0.01) < 1e-9
