"""Widened training releases (``SPPE(..., widening=...)``): each coordinate's noise ``factor`` times larger with
probability ``share``, weighted back by ``eta / r``. The releases and weights against the scalar mechanisms cell by
cell, the weights' expectations against exact values (a Laplace tail 5 scales out), the refusals, and a resumed fit
against an uninterrupted one (a widened fit against the exact Poisson-counts posteriors: test_amortized.py)."""

import math

import pytest
import torch

import dpsbi
from dpsbi.inference.widening import Widening, widened_releases
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
    """Its ancillary directions span exactly naive Bayes' three constraints; regression's statistic has none; off
    unless asked for."""
    naive_bayes = load("naive_bayes")
    basis = dpsbi.SPLE(naive_bayes, amortized=True, widening=True).ancillary
    constraints = _naive_bayes_constraints()
    assert basis.shape == (3, 8)
    torch.testing.assert_close(basis @ basis.T, torch.eye(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(constraints @ basis.T @ basis, constraints, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="linear constraints"):
        dpsbi.SPLE(load("regression"), amortized=True, widening=True)
    assert dpsbi.SPLE(naive_bayes, amortized=True).widening is None
    with pytest.raises(ValueError, match="amortized=True"):
        dpsbi.SPLE(naive_bayes, widening=True)


def test_a_weight_along_the_ancillary_directions_leaves_the_likelihoods_normalizer_the_same_for_every_statistic():
    """SPLE's optimum is ``eta(y | s) g(y) / c(s)``: the posterior is exact only where ``c(s) = E[g(y) | s]`` does
    not depend on ``s``. Estimated over widened releases (``E_r[w g]``) at two naive-Bayes tables far apart, ``c``
    agrees within 4 Monte Carlo standard errors where ``g`` (an untrained classifier) reads the release along the
    ancillary directions, and differs by more than 20 where it reads the whole release."""
    from dpsbi.inference.widening import ReleaseRatio, ancillary_basis

    task = load("naive_bayes", epsilon=1.5, y_obs="simulate")
    mechanism, n = task.mechanism, 100_000
    basis = ancillary_basis(task.simulate(task.prior.sample((1000,)), torch.Generator().manual_seed(1)))
    tables = torch.tensor(
        [[0.40, 0.05, 0.30, 0.15, 0.05, 0.50, 0.50, 0.05], [0.10, 0.20, 0.15, 0.15, 0.35, 0.35, 0.30, 0.40]]
    )
    generator = torch.Generator().manual_seed(2)
    gaps = {}
    for name, reads in (("ancillary", basis), ("whole", None)):
        torch.manual_seed(3)
        k = len(reads) if reads is not None else 8
        g = ReleaseRatio(torch.zeros(k), torch.full((k,), mechanism.scale), 1000.0, reads).requires_grad_(
            False
        )
        estimates = []
        for table in tables:
            u = torch.rand(n, 1, mechanism.noise_dim, generator=generator)
            pick = torch.rand(n, 1, 8, generator=generator)
            y, log_w = widened_releases(mechanism, table.expand(n, 8), None, u, pick, Widening())
            values = (log_w + g(y, None)).exp().double().flatten()
            estimates.append((values.mean(), values.var() / n))
        (a, var_a), (b, var_b) = estimates
        gaps[name] = float(abs(a - b) / (var_a + var_b) ** 0.5)
    assert gaps["ancillary"] < 4 and gaps["whole"] > 20, gaps
