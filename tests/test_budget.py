"""Fits that end when they are done: a budget in simulations (never exceeded: the last round is cut) or seconds
(no round expected to end past it), and the optional stop once the posterior at y_obs no longer changes; every
fit records why it stopped."""

import pytest
import torch

import dpsbi
from dpsbi.inference import checkpoint
from dpsbi.inference import estimator as estimator_module
from dpsbi.inference.estimator import Budget
from dpsbi.tasks import load

TINY = dict(flow=dict(transforms=1, hidden=16), training=dict(max_steps=20), progress=False)


@pytest.fixture(scope="module")
def task():
    return load("conjugate_gaussian", epsilon=1.0, dim=2)


@pytest.mark.parametrize("method", ["SPPE", "SPLE", "NaiveNPE"])
def test_a_simulation_budget_is_never_exceeded(task, method):
    mcmc = dict(mcmc=dict(num_chains=20, warmup=5, init_candidates=100)) if method == "SPLE" else {}
    size = dict(num_simulations=500) if method == "NaiveNPE" else dict(rounds=5, sims_per_round=100)
    estimator = getattr(dpsbi, method)(task, **size, budget=dict(simulations=250), **mcmc, **TINY)
    estimator.run()
    counts = [entry["num_simulations"] for entry in estimator.history]
    if method == "NaiveNPE":  # one round of num_simulations, cut to the budget
        assert counts == [250] and estimator.stop_reason == "rounds"
    else:  # 100, 200, then a round cut to the 50 left
        assert counts == [100, 200, 250] and estimator.stop_reason == "simulations"
    assert estimator.num_simulations == 250 == len(estimator.data["theta"])
    assert [entry.get("stop") for entry in estimator.history[:-1]] == [None] * (len(counts) - 1)


def test_a_budget_with_too_few_left_for_a_round_stops_before_it(task):
    estimator = dpsbi.SPPE(task, rounds=5, sims_per_round=100, budget=dict(simulations=201), **TINY)
    estimator.run()  # 1 simulation left: no round of one (a training and a validation row at least)
    assert estimator.num_simulations == 200 and estimator.stop_reason == "simulations"


def test_a_seconds_budget_starts_no_round_expected_to_end_past_it(task, monkeypatch):
    """Every round takes 10 (fake) seconds: after two rounds (20 s) a third would end at 30 s > 25 s."""

    class Clock:
        now = 0.0

        def perf_counter(self):
            self.now += 10.0  # a round reads the clock at its start and its end: 10 s a round
            return self.now

    monkeypatch.setattr(estimator_module, "time", Clock())
    estimator = dpsbi.SPPE(task, rounds=10, sims_per_round=100, budget=dict(seconds=25), **TINY)
    estimator.run()
    assert [entry["seconds"] for entry in estimator.history] == [10.0, 10.0]
    assert estimator.stop_reason == "seconds"


def test_a_seconds_budget_on_a_real_clock_ends_the_fit_early(task):
    estimator = dpsbi.SPPE(task, rounds=50, sims_per_round=100, budget=dict(seconds=1e-3), **TINY)
    estimator.run()  # the first round always runs; none after it fits in a millisecond
    assert len(estimator.history) == 1 and estimator.stop_reason == "seconds"


def test_a_resumed_fit_with_a_larger_budget_goes_on(task, tmp_path):
    settings = dict(rounds=5, sims_per_round=100, checkpoint_dir=tmp_path, **TINY)
    first = dpsbi.SPPE(task, budget=dict(simulations=150), **settings)
    first.run()
    assert first.num_simulations == 150 and first.stop_reason == "simulations"
    again = dpsbi.SPPE(task, budget=dict(simulations=350), **settings)
    again.run()
    assert [entry["num_simulations"] for entry in again.history] == [100, 150, 250, 350]
    assert [entry.get("stop") for entry in again.history] == [None, None, None, "simulations"]
    assert torch.equal(again.data["theta"][:150], first.data["theta"])


def test_appended_simulations_past_the_budget_are_refused(task):
    estimator = dpsbi.SPPE(task, rounds=2, sims_per_round=100, budget=dict(simulations=100), **TINY)
    theta = task.prior.sample((150,))
    estimator.append_simulations(theta, task.simulate(theta))
    with pytest.raises(ValueError, match="past budget simulations=100"):
        estimator.run()
    assert estimator.num_simulations == 0 and estimator.pending is not None  # the round left no trace


def test_stop_when_stable_records_the_change_and_stops(task):
    estimator = dpsbi.SPPE(task, rounds=4, sims_per_round=100, stop_when_stable=1e9, **TINY)
    estimator.run()  # any change is below a huge tolerance: stop after the first comparison
    assert len(estimator.history) == 2 and estimator.stop_reason == "stable"
    assert "change" not in estimator.history[0] and estimator.history[1]["change"] >= 0
    estimator = dpsbi.SPPE(task, rounds=3, sims_per_round=100, stop_when_stable=1e-12, **TINY)
    estimator.run()  # never stable: all rounds
    assert len(estimator.history) == 3 and estimator.stop_reason == "rounds"
    assert all(entry["change"] > 1e-12 for entry in estimator.history[1:])


def test_the_stability_statistic_of_one_posterior_with_itself_is_zero(task):
    """The draws are taken under a fixed seed: the same flow gives the same draws, a change of exactly zero."""
    estimator = dpsbi.SPPE(task, rounds=1, sims_per_round=100, stop_when_stable=0.1, **TINY)
    posterior = estimator.run()
    summary = estimator.stability_summary(posterior)
    assert summary.shape == (2, 2) and estimator.stability_change(summary, summary) == 0.0
    shifted = summary.clone()
    shifted[0, 1] += 0.5 * summary[1, 1]  # half an sd on the second parameter
    assert estimator.stability_change(summary, shifted) == pytest.approx(0.5)


def test_budget_and_stop_rule_are_checked(task):
    with pytest.raises(ValueError, match="budget simulations"):
        dpsbi.SPPE(task, budget=dict(simulations=1), **TINY)
    with pytest.raises(ValueError, match="budget seconds"):
        dpsbi.SPPE(task, budget=dict(seconds=0), **TINY)
    with pytest.raises(ValueError, match="unknown budget settings"):
        dpsbi.SPPE(task, budget=dict(minutes=3), **TINY)
    with pytest.raises(ValueError, match="leaves no first round"):
        dpsbi.SPPE(task, budget=dict(simulations=2), training=dict(validation_fraction=0.9), progress=False)
    with pytest.raises(ValueError, match="tolerance > 0"):
        dpsbi.SPPE(task, stop_when_stable=0.0, **TINY)
    no_release = load("conjugate_gaussian", epsilon=1.0, dim=2)
    no_release.y_obs = None
    with pytest.raises(ValueError, match="has none"):
        dpsbi.SPPE(no_release, amortized=True, stop_when_stable=0.1, **TINY)
    assert Budget.coerce(None) == Budget() and not Budget().limited


def test_budgets_do_not_change_the_fit_or_its_checkpoint_identity(task):
    """A budget only decides when to stop: the fingerprint's comparable part, and the defaults, are unchanged."""
    plain = dpsbi.SPPE(task, **TINY).fingerprint()
    limited = dpsbi.SPPE(task, budget=dict(seconds=60), stop_when_stable=0.1, **TINY).fingerprint()

    def comparable(fingerprint: dict) -> dict:
        return {k: v for k, v in fingerprint.items() if k not in checkpoint.RESUMABLE}

    assert comparable(limited) == comparable(plain)
    assert "budget" not in plain and "stop_when_stable" not in plain
