"""scripts/amortized_check.py's references where a task has no exact posterior (regression): the validated
sampler run at each prior-predictive release, not at the task's stored one."""

import argparse
import json

import amortized_check  # scripts/ is on the tests' path (pyproject.toml)
import torch
from frontier import reference_for

TINY = {"importance_particles": 500, "importance_draws": 20_000}


def test_regression_references_follow_the_release(tmp_path, monkeypatch):
    monkeypatch.setenv("DPSBI_CACHE", str(tmp_path))
    arguments, _, _ = amortized_check.TASKS["regression"]
    task = amortized_check.load({**arguments, "y_obs": None}, 10.0)  # the stored release at epsilon 10
    stored = reference_for(task, {"name": "regression", "epsilon": 10.0}).samples.double()
    again = amortized_check.exact_draws(task, arguments, task.y_obs[0], 1000, 0, TINY).double()
    # at the same release, 1000 draws of a small sampler against the stored reference (2000 draws, ESS 38 000):
    # means within ~5 Monte Carlo sds (sd / sqrt(1000) ~ 0.03), sds within 15 %
    assert (again.mean(0) - stored.mean(0)).abs().max() < 0.15
    assert ((again.std(0) / stored.std(0)).log().abs() < 0.15).all()
    # at the release of beta = 0 the posterior moves: beta_1's mean is -2.63 at the stored release
    zero = torch.zeros(1, 3, dtype=task.prior.mean.dtype)
    y = task.simulate_release(zero, generator=torch.Generator().manual_seed(0))[0]
    other = amortized_check.exact_draws(task, arguments, y, 1000, 0, TINY).double()
    assert (other.mean(0) - stored.mean(0)).abs().max() > 1.0
    # cached by release: a second fit scored there gets the same draws without sampling again
    assert list(tmp_path.rglob("*.pt"))
    assert torch.equal(amortized_check.exact_draws(task, arguments, y, 1000, 0, TINY).double(), other)


def test_a_fit_line_skips_only_its_own_method(tmp_path):
    out = tmp_path / "rows.jsonl"
    rows = [
        {"task": "naive_bayes", "fit_done": True},  # SPPE's, written before --method existed
        {"task": "conjugate_gaussian", "method": "sple", "fit_done": True},
        {"task": "poisson_counts", "method": "sple", "epsilon": 0.5},  # a scored row of an unfinished fit
    ]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert amortized_check.finished(out) == {
        ("naive_bayes", "sppe", None),
        ("conjugate_gaussian", "sple", None),
    }


def test_scored_epsilons_keep_the_task_s_seeds():
    """``--epsilons`` picking the task's own keep each one's release seed (its index); others come after them."""
    args = argparse.Namespace(epsilons=[9.0, 4.0], range=None)
    assert amortized_check.scored_epsilons("naive_bayes", args) == [(1, 4.0), (2, 9.0)]
    assert amortized_check.scored_epsilons("poisson_counts", args) == []  # neither is one of its three
    args = argparse.Namespace(epsilons=[0.15, 1.0, 9.0], range=[0.1, 10.0])  # a hundredfold range
    assert amortized_check.scored_epsilons("poisson_counts", args) == [(0, 0.15), (4, 1.0), (5, 9.0)]
    assert amortized_check.scored_epsilons(
        "poisson_counts", argparse.Namespace(epsilons=None, range=None)
    ) == [
        (0, 0.15),
        (1, 0.5),
        (2, 1.5),
    ]
