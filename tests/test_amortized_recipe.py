"""A task's own recipe for an amortized SPPE fit (``Task.amortized_recipe``): SIR's default amortized fit is the
measured recipe (docs/RESULTS.md, "SIR's amortized default"), the same fit bit for bit as the recipe spelled out;
what a call sets stays the call's; the widened epsilon range trains outside and answers inside; the saved
posterior loads with the task the user has; dpsbi-run reaches the same fit."""

from __future__ import annotations

import pytest
import torch

import dpsbi
from dpsbi.baselines import corrected
from dpsbi.tasks import load, with_options
from dpsbi.tasks.sir import AMORTIZED_RECIPE

#: SIR's recipe, small enough to train in seconds.
SMALL = {
    **AMORTIZED_RECIPE,
    "sims_per_round": 300,
    "training": {**AMORTIZED_RECIPE["training"], "max_steps": 20},
}


def small_sir():
    task = load("sir")
    task.amortized_recipe = SMALL
    return task


def test_sir_amortized_default_is_its_recipe():
    fit = dpsbi.SPPE(load("sir"), amortized=True, epsilon_range=(0.1, 10), progress=False)
    assert (fit.rounds, fit.sims_per_round) == (1, 1_000_000)
    assert (fit.training.lr, fit.training.max_steps) == (3e-3, 13_000)
    assert fit.task.spec["kwargs"]["simulator"] == "tau_leap" and not fit.task.costly_simulator
    assert fit.epsilon_range == (0.1, 10) and fit.training_epsilon_range == (0.05, 20)
    assert fit.options()["task_options"] == {"simulator": "tau_leap"}
    # not amortized, the fit at y_obs: the generic defaults on the exact simulator
    sequential = dpsbi.SPPE(load("sir"), progress=False)  # its sequential recipe: only truncation and steps
    assert (sequential.rounds, sequential.sims_per_round, sequential.training.lr) == (10, 1000, 1e-3)
    assert sequential.task.costly_simulator and sequential.task_options == {}
    # loaded as tau-leaping, the recipe is the same fit without rebuilding the task
    assert load("sir", simulator="tau_leap").amortized_recipe == {**AMORTIZED_RECIPE, "task_options": {}}


def test_what_the_call_sets_stays_the_calls():
    task = load("sir")
    own = dpsbi.SPPE(task, amortized=True, sims_per_round=500, progress=False)  # a budget of its own
    assert (own.rounds, own.sims_per_round, own.training.lr, own.training.max_steps) == (10, 500, 1e-3, 1000)
    assert own.task.spec["kwargs"]["simulator"] == "tau_leap"  # the model still the recipe's
    exact = dpsbi.SPPE(task, amortized=True, task_options={}, progress=False)
    assert exact.task is task and exact.task.costly_simulator and exact.sims_per_round == 1_000_000
    steps = dpsbi.SPPE(task, amortized=True, training=dict(max_steps=5), progress=False)
    assert (steps.training.max_steps, steps.training.lr) == (5, 3e-3)  # the call's field over the recipe's
    assert dpsbi.SPPE(
        task, amortized=True, epsilon_range=(1, 2), epsilon_margin=1
    ).training_epsilon_range == (1, 2)
    with pytest.raises(ValueError, match="epsilon_margin must be a factor >= 1"):
        dpsbi.SPPE(task, amortized=True, epsilon_range=(1, 2), epsilon_margin=0.5)
    with pytest.raises(ValueError, match="widens epsilon_range, but the fit has none"):
        dpsbi.SPPE(task, amortized=True, epsilon_margin=2)
    with pytest.raises(ValueError, match="not built by dpsbi.tasks.load"):
        with_options(dpsbi.tasks.sir.make(), {"simulator": "tau_leap"})


def test_the_recipe_is_the_spelled_out_fit_bit_for_bit(tmp_path):
    """The recipe's fit equals the explicit call on the tau-leaping task over the widened range, so the
    measurements of that call (docs/RESULTS.md) are the default's; its posterior answers over the range asked."""
    recipe = dpsbi.SPPE(small_sir(), amortized=True, epsilon_range=(0.1, 10), progress=False)
    explicit = dpsbi.SPPE(
        load("sir", simulator="tau_leap"),
        amortized=True,
        epsilon_range=(0.05, 20),
        epsilon_margin=1,
        rounds=1,
        sims_per_round=300,
        training=dict(lr=3e-3, max_steps=20),
        progress=False,
    )
    posterior, _ = recipe.run(), explicit.run()
    assert recipe.data["epsilon"].min() < 0.1 and recipe.data["epsilon"].max() > 10
    assert torch.equal(recipe.data["epsilon"], explicit.data["epsilon"])
    for a, b in zip(recipe.flow.state_dict().values(), explicit.flow.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert posterior.epsilon_range == (0.1, 10)
    with pytest.raises(ValueError, match=r"outside the range \[0.1, 10\]"):
        posterior.sample((10,), epsilon=0.07)  # trained there, but its answers are for the range asked
    # saved, it loads with the task the user has (rebuilt with the recipe's options) and with none
    posterior.save(tmp_path / "sir.pt")
    y = load("sir").y_obs
    draws = posterior.sample((50,), y=y, epsilon=10.0, seed=1)
    for task in (load("sir"), None):
        again = dpsbi.load_posterior(tmp_path / "sir.pt", task=task)
        assert again.task.spec["kwargs"]["simulator"] == "tau_leap"
        assert torch.equal(again.sample((50,), y=y, epsilon=10.0, seed=1), draws)
    with pytest.raises(ValueError, match="another model"):
        dpsbi.load_posterior(tmp_path / "sir.pt", task=load("sir", epsilon=1.0))
    # its draws corrected against the exact model: the task given simulates, not the tau-leaping one it trained on
    exact, counted = load("sir"), []
    simulate = exact.simulator
    exact.simulator = lambda theta, generator=None: counted.append(len(theta)) or simulate(theta, generator)
    # 20 draws of a tiny fit: its weights collapse; what is counted is what matters here
    with pytest.warns(UserWarning, match="weights collapsed"):
        result = corrected(
            posterior, 20, y=y, epsilon=10.0, simulations_per_draw=1, seed=0, progress=False, task=exact
        )
    assert sum(counted) == result.num_simulations > 0 and result.samples.shape == (20, 2)
    with pytest.raises(ValueError, match="another model than the posterior's: epsilon"):
        corrected(posterior, 20, y=y, progress=False, task=load("sir", epsilon=1.0))


def test_dpsbi_run_reaches_the_recipe():
    """A config's ``training`` at the library's defaults is left to the estimator, as a call would leave it, so
    ``dpsbi-run task=sir method.amortized=true`` fits the recipe, and a field the user sets is the user's."""
    from hydra import compose, initialize_config_dir

    from dpsbi.experiment import config_dir, plan
    from dpsbi.experiment.methods import estimator_arguments

    base = [
        "task=sir",
        "method=sppe",
        "companions=[]",
        "method.amortized=true",
        "method.epsilon_range=[0.1,10]",
    ]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        ((method, settings),) = plan(compose("config", overrides=base)).methods
        ((_, own),) = plan(compose("config", overrides=[*base, "method.training.lr=5e-4"])).methods
    assert settings["training"]["lr"] == 1e-3  # the run's record spells out the library's default
    fit = dpsbi.SPPE(load("sir"), **estimator_arguments(method, settings), progress=False)
    assert (fit.rounds, fit.sims_per_round, fit.training.lr, fit.training.max_steps) == (
        1,
        1_000_000,
        3e-3,
        13_000,
    )
    assert dpsbi.SPPE(load("sir"), **estimator_arguments(method, own), progress=False).training.lr == 5e-4
