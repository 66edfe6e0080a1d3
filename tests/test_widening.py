"""Widened training releases (``SPPE(..., widening=...)``, ``SPLE(..., widening=...)``): each coordinate's noise
``factor`` times larger with probability ``share``, weighted back by ``eta / r``. The releases and weights against the
scalar mechanisms cell by cell, the weights' expectations against exact values (a Laplace tail 5 scales out), the
refusals, and a resumed fit against an uninterrupted one (a widened fit against the exact Poisson-counts
posteriors: test_amortized.py); SPLE's ancillary directions (naive Bayes' constraints), the normalizer they keep
flat, and their refusals."""

import math

import pytest
import torch

import dpsbi
from dpsbi.inference.widening import (
    ReleaseRatio,
    Widening,
    ancillary_basis,
    ancillary_problem,
    widened_releases,
)
from dpsbi.mechanisms import Gaussian, Laplace
from dpsbi.tasks import load

MECHANISMS = {"laplace": lambda: Laplace(1.0, 1.0, 2), "gaussian": lambda: Gaussian(0.5, 1e-5, 1.0, 2)}


@pytest.mark.parametrize("family", sorted(MECHANISMS))
def test_each_cell_is_the_mechanism_at_its_epsilon_its_noise_scaled_where_picked_and_the_weight_is_eta_over_r(
    family,
):
    mechanism, settings = MECHANISMS[family](), Widening(factor=4.0, share=0.3)
    generator = torch.Generator().manual_seed(0)
    s, eps = torch.randn(3, 2, generator=generator), torch.tensor([0.4, 1.0, 2.5])
    u, pick = torch.rand(3, 2, 2, generator=generator), torch.rand(3, 2, 2, generator=generator)
    y, log_w = widened_releases(mechanism, s, eps, u, pick, settings)
    for i in range(3):
        at = mechanism.with_epsilon(float(eps[i]))
        for m in range(2):
            scale = torch.where(pick[i, m] < 0.3, 4.0, 1.0)
            torch.testing.assert_close(
                y[i, m], s[i] + scale * (at.sample(s[i : i + 1], u[i, m : m + 1])[0] - s[i])
            )
            plain = at.coordinate_log_prob(y[i, m], s[i]).double()
            wide = at.coordinate_log_prob(s[i] + (y[i, m] - s[i]) / 4.0, s[i]).double() - math.log(4.0)
            log_r = torch.log(0.7 * plain.exp() + 0.3 * wide.exp())
            assert abs(float(log_w[i, m]) - float((plain - log_r).sum())) < 1e-5


def test_the_weights_recover_the_mechanisms_expectations_and_its_far_tail():
    """Over widened draws, ``E_r[w] = 1`` and ``E_r[w 1{n_1 > 5 b}] = e^-5 / 2``, the exact Laplace tail (a
    draw in 300 under the mechanism), each within 5 Monte Carlo standard errors of its own estimate."""
    mechanism, n = Laplace(1.0, 1.0, 2), 200_000
    generator = torch.Generator().manual_seed(1)
    s = torch.zeros(n, 2)
    u, pick = torch.rand(n, 1, 2, generator=generator), torch.rand(n, 1, 2, generator=generator)
    y, log_w = widened_releases(mechanism, s, None, u, pick, Widening())
    w = log_w.exp().flatten()
    tail = w * (y[:, 0, 0] > 5.0)
    for values, exact in ((w, 1.0), (tail, 0.5 * math.exp(-5.0))):
        error = values.std() / n**0.5
        assert abs(float(values.mean()) - exact) < 5 * float(error), (float(values.mean()), exact)
    assert float((y[:, 0, 0] > 5.0).float().mean()) > 5 * 0.5 * math.exp(
        -5.0
    )  # the tail is common in training


def test_widening_is_refused_in_one_line_where_it_does_not_apply():
    regression = load("regression", epsilon=1.0)
    with pytest.raises(ValueError, match="amortized=True"):
        dpsbi.SPPE(regression, widening={})
    for name in ("census_table", "sir"):  # discrete Gaussian (a lattice), the binomial curve (no coordinates)
        with pytest.raises(ValueError, match="widening"):
            dpsbi.SPPE(load(name), amortized=True, widening={})
    with pytest.raises(ValueError, match="factor > 1"):
        dpsbi.SPPE(regression, amortized=True, widening=dict(factor=1.0))
    with pytest.raises(ValueError, match="unknown widening settings"):
        dpsbi.SPPE(regression, amortized=True, widening=dict(scale=3.0))


def test_amortized_fits_widen_by_default_where_the_task_says_its_missed_releases_are_far_noise_draws():
    """Naive Bayes (``amortized_widening``) widens at the defaults; ``widening=False`` turns it off, ``True`` or a
    dict on; a fit at ``y_obs``, regression and a task whose mechanism cannot be widened do not by default."""
    naive_bayes = load("naive_bayes")
    assert naive_bayes.amortized_widening and not load("regression").amortized_widening
    assert dpsbi.SPPE(naive_bayes, amortized=True).widening == Widening()
    assert dpsbi.SPPE(naive_bayes, amortized=True, widening=False).widening is None
    assert dpsbi.SPPE(naive_bayes, amortized=True, widening={"share": 0.1}).widening == Widening(share=0.1)
    assert dpsbi.SPPE(naive_bayes).widening is None
    assert dpsbi.SPPE(load("regression"), amortized=True).widening is None
    assert dpsbi.SPPE(load("regression"), amortized=True, widening=True).widening == Widening()
    census = load("census_table")
    # a lattice mechanism: the default stays off rather than refusing the fit
    census.amortized_widening = True
    assert dpsbi.SPPE(census, amortized=True).widening is None


def test_a_resumed_widened_fit_refits_the_same_classifier_and_ends_where_an_uninterrupted_one_does(tmp_path):
    task = load("poisson_counts", epsilon=0.2)
    options = dict(
        amortized=True,
        sims_per_round=200,
        flow=dict(transforms=1, hidden=8),
        training=dict(max_steps=20),
        widening=dict(classifier_steps=50),
        progress=False,
    )
    dpsbi.SPPE(task, rounds=1, checkpoint_dir=tmp_path / "killed", **options).run()
    resumed = dpsbi.SPPE(task, rounds=2, checkpoint_dir=tmp_path / "killed", **options)
    resumed.run()
    whole = dpsbi.SPPE(task, rounds=2, checkpoint_dir=tmp_path / "whole", **options)
    whole.run()
    for a, b in zip(resumed.flow.state_dict().values(), whole.flow.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert whole.fingerprint()["widening"] == Widening(classifier_steps=50).to_dict()
    with pytest.raises(ValueError, match="widening"):  # another run's checkpoint
        dpsbi.SPPE(task, rounds=2, checkpoint_dir=tmp_path / "whole", **{**options, "widening": None}).run()


def _naive_bayes_constraints() -> torch.Tensor:
    """Naive Bayes' three linear constraints on its 8 cells (order class, feature, value): each class's two
    features count the same records, and all cells sum to 2 (features) x n."""
    return torch.tensor(
        [[1.0, 1, -1, -1, 0, 0, 0, 0], [0.0, 0, 0, 0, 1, 1, -1, -1], [1.0, 1, 1, 1, 1, 1, 1, 1]]
    )


def test_sple_widens_along_the_statistics_linear_constraints_and_refuses_a_statistic_without_them():
    """Its ancillary directions span exactly naive Bayes' three constraints; regression's statistic has none: asked
    for, refused; by default (a task that says its missed releases are far noise draws) quietly off."""
    naive_bayes = load("naive_bayes")
    basis = dpsbi.SPLE(naive_bayes, amortized=True, widening=True).ancillary
    constraints = _naive_bayes_constraints()
    assert basis.shape == (3, 8)
    torch.testing.assert_close(basis @ basis.T, torch.eye(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(constraints @ basis.T @ basis, constraints, atol=1e-5, rtol=0)
    regression = load("regression")
    with pytest.raises(ValueError, match="linear constraints"):
        dpsbi.SPLE(regression, amortized=True, widening=True)
    regression.amortized_widening = True
    quietly_plain = dpsbi.SPLE(regression, amortized=True)
    assert quietly_plain.widening is quietly_plain.ancillary is None
    default = dpsbi.SPLE(naive_bayes, amortized=True)
    assert default.widening == Widening() and default.ancillary.shape == (3, 8)
    assert dpsbi.SPLE(naive_bayes, amortized=True, widening=False).widening is None
    with pytest.raises(ValueError, match="amortized=True"):
        dpsbi.SPLE(naive_bayes, widening=True)


def test_a_weight_along_the_ancillary_directions_leaves_the_likelihoods_normalizer_the_same_for_every_statistic():
    """SPLE's optimum is ``eta(y | s) g(y) / c(s)``: the posterior is exact only where ``c(s) = E[g(y) | s]`` does
    not depend on ``s``. Estimated over the same widened noise draws (``E_r[w g]``) at two naive-Bayes tables far
    apart, every term agrees to float precision where ``g`` (an untrained classifier) reads the release along the
    ancillary directions, and the two means lie more than 20 standard errors (of their paired difference) apart
    where it reads the whole release."""
    task = load("naive_bayes", epsilon=1.5, y_obs="simulate")
    mechanism, n = task.mechanism, 100_000
    basis = ancillary_basis(task.simulate(task.prior.sample((1000,)), torch.Generator().manual_seed(1)))
    tables = torch.tensor(
        [[0.40, 0.05, 0.30, 0.15, 0.05, 0.50, 0.50, 0.05], [0.10, 0.20, 0.15, 0.15, 0.35, 0.35, 0.30, 0.40]]
    )
    generator = torch.Generator().manual_seed(2)
    u, pick = (
        torch.rand(n, 1, mechanism.noise_dim, generator=generator),
        torch.rand(n, 1, 8, generator=generator),
    )
    terms = {}
    for name, reads in (("ancillary", basis), ("whole", None)):
        torch.manual_seed(3)
        k = len(reads) if reads is not None else 8
        g = ReleaseRatio(torch.zeros(k), torch.full((k,), mechanism.scale), 1000.0, reads).requires_grad_(
            False
        )
        terms[name] = []
        for table in tables:
            y, log_w = widened_releases(mechanism, table.expand(n, 8), None, u, pick, Widening())
            terms[name].append((log_w + g(y, None)).exp().double().flatten())
    a, b = terms["ancillary"]
    assert float((a - b).abs().max()) <= 1e-5 * float(a.max())
    difference = terms["whole"][0] - terms["whole"][1]
    assert abs(float(difference.mean())) > 20 * float(difference.std()) / n**0.5


def test_the_ancillary_directions_are_refused_where_the_statistic_moves_along_them_against_the_noise():
    """Three cells summing to 1 up to ``wobble`` along the constraint, under noise of sd 0.1: the constraint is
    found, and kept at a wobble of 1e-6 (1e-5 of the noise), refused at 1e-2 (0.1 of it)."""
    generator = torch.Generator().manual_seed(0)
    free = torch.rand(5000, 3, generator=generator)
    constrained = free / free.sum(-1, keepdim=True)
    along = torch.randn(5000, 1, generator=generator) * torch.ones(3) / 3**0.5
    noise = 0.1 * torch.randn(5000, 3, generator=generator)
    basis = ancillary_basis(constrained)
    torch.testing.assert_close(basis.abs(), torch.full((1, 3), 3**-0.5), atol=1e-5, rtol=0)
    assert ancillary_problem(basis, (constrained.double() + 1e-6 * along.double()), noise) is None
    assert "varies along its constrained directions" in ancillary_problem(
        basis, constrained + 1e-2 * along, noise
    )
    assert "has none" in ancillary_problem(ancillary_basis(free), free, noise)


def test_a_widened_sple_fit_finds_the_same_directions_each_time_and_its_checkpoint_names_the_widening():
    naive_bayes = load("naive_bayes")
    first, second = (dpsbi.SPLE(naive_bayes, amortized=True, widening={"share": 0.1}) for _ in range(2))
    torch.testing.assert_close(first.ancillary, second.ancillary, rtol=0, atol=0)
    assert first.fingerprint()["widening"] == Widening(share=0.1).to_dict()
    assert "widening" not in dpsbi.SPLE(naive_bayes, amortized=True, widening=False).fingerprint()


def test_without_a_simulator_sple_finds_the_directions_on_the_appended_simulations():
    task = load("naive_bayes")
    theta = task.prior.sample((2000,))
    s = task.simulate(theta, torch.Generator().manual_seed(0))
    task.simulator = None
    assert dpsbi.SPLE(task, amortized=True).widening is None  # the default: no probe before the fit
    options = dict(widening=dict(classifier_steps=20), training=dict(max_steps=5), progress=False)
    estimator = dpsbi.SPLE(task, amortized=True, rounds=1, sims_per_round=2000, **options)
    assert estimator.ancillary is None  # no probe at construction
    estimator.append_simulations(theta, s).run()
    constraints = _naive_bayes_constraints()
    torch.testing.assert_close(
        constraints @ estimator.ancillary.T @ estimator.ancillary, constraints, atol=1e-5, rtol=0
    )
