"""Compositions of mechanisms: block-wise draws and likelihoods, per-block lattices, the total privacy loss (checked
against OpenDP's own map of the composed measurement), refusals, and SPPE / SPLE on a composed release."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

import dpsbi
from dpsbi.inference.losses import dequantized, noise_uniforms
from dpsbi.mechanisms import (
    Composition,
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    IntractableLikelihood,
    Laplace,
    PostProcessed,
    consistent_total,
    nonnegative,
)
from dpsbi.mechanisms.discrete import zcdp_epsilon
from dpsbi.tasks.custom import normal
from dpsbi.tasks.identity import differences, mechanism_identity

SEED = 20260


def mixed() -> Composition:
    """A continuous block (2 coordinates, per-coordinate scales), a discrete Gaussian and a clamped discrete Laplace."""
    return Composition(
        [
            Laplace.from_scale((2.0, 0.5), (1.0, 1.0)),
            DiscreteGaussian.from_rho(0.5, 1.0, 1),
            PostProcessed(DiscreteLaplace(1.0, 1.0, 1), nonnegative),
        ]
    )


def test_log_prob_is_the_sum_of_the_blocks_and_the_map_is_theirs():
    comp = mixed()
    assert (comp.dim, comp.input_dim, comp.noise_dim) == (4, 4, 4) and comp.dtype == torch.float64
    s = torch.tensor([[1.0, -2.0, 7.0, 1.0]], dtype=torch.float64)
    u = torch.rand(50, 4, generator=torch.Generator().manual_seed(SEED), dtype=torch.float64)
    y = comp.sample(s.expand(50, 4), u)
    laplace, dgauss, clamped = comp.blocks
    parts = [laplace.sample(s[:, :2].expand(50, 2), u[:, :2])]
    parts += [
        dgauss.sample(s[:, 2:3].expand(50, 1), u[:, 2:3]),
        clamped.sample(s[:, 3:].expand(50, 1), u[:, 3:]),
    ]
    assert torch.equal(
        y, torch.cat(parts, -1)
    )  # each block's uniforms are its own slice: RQMC covers them all
    expected = laplace.log_prob(y[:, :2], s[:, :2]) + dgauss.log_prob(y[:, 2:3], s[:, 2:3])
    expected += clamped.log_prob(y[:, 3:], s[:, 3:])
    assert torch.allclose(comp.log_prob(y, s), expected, rtol=1e-12)
    bound = laplace.max_log_prob(y[:, :2]) + dgauss.max_log_prob(y[:, 2:3]) + clamped.max_log_prob(y[:, 3:])
    assert torch.allclose(comp.max_log_prob(y), bound) and bool((comp.log_prob(y, s) <= bound).all())
    assert bool(comp.in_support(y).all()) and not bool(comp.in_support(y + 0.5).any())


def test_log_prob_matches_brute_force_enumeration_on_integers():
    """Two integer blocks: the joint pmf from enumerating both noises (closed-form pmfs) is the composition's."""
    comp = Composition(
        [DiscreteLaplace(0.7, 1.0, 1), PostProcessed(DiscreteGaussian(sigma=1.3), nonnegative)]
    )
    s = torch.tensor([2.0, 1.0], dtype=torch.float64)
    k = np.arange(-60, 61)
    p = math.exp(-0.7)
    laplace_pmf = (1 - p) / (1 + p) * p ** np.abs(k)
    gauss = np.exp(-(k**2) / (2 * 1.3**2))
    gauss_pmf = gauss / gauss.sum()
    y1 = np.arange(-10, 15)
    y2 = np.arange(0, 12)
    first = np.array([laplace_pmf[k == v - 2].sum() for v in y1])
    second = np.array([gauss_pmf[(np.maximum(k + 1, 0)) == v].sum() for v in y2])  # clamped at 0
    grid = torch.tensor([[a, b] for a in y1 for b in y2], dtype=torch.float64)
    exact = np.outer(first, second).ravel()
    assert np.allclose(comp.log_prob(grid, s).exp().numpy(), exact, rtol=1e-10, atol=1e-300)
    assert exact.sum() == pytest.approx(1.0, abs=1e-3)  # the grid holds nearly all the mass


def test_draws_reproduce_each_blocks_distribution():
    comp = mixed()
    s = torch.tensor([1.0, -2.0, 7.0, 1.0], dtype=torch.float64)
    y = comp.sample(s.expand(20000, 4), generator=torch.Generator().manual_seed(SEED))
    for j, b in enumerate((2.0, 0.5)):
        assert stats.kstest(y[:, j].numpy(), stats.laplace(loc=s[j].item(), scale=b).cdf).pvalue > 1e-3
    values, counts = torch.unique(y[:, 2], return_counts=True)
    pmf = comp.blocks[1].log_prob(values[:, None], s[2:3]).exp().numpy()
    keep = pmf * 20000 > 5  # chi-square cells with enough expected counts
    observed = counts.numpy()[keep]
    assert stats.chisquare(observed, pmf[keep] * observed.sum() / pmf[keep].sum()).pvalue > 1e-3
    zeros = (y[:, 3] == 0).double().mean().item()  # P(1 + n <= 0) for the clamped discrete Laplace
    p0 = comp.blocks[2].log_prob(torch.zeros(1, 1, dtype=torch.float64), s[3:]).exp().item()
    assert abs(zeros - p0) < 4 * math.sqrt(p0 * (1 - p0) / 20000)


# ---- privacy accounting, against OpenDP ------------------------------------------------------------------------


dp = pytest.importorskip("opendp.prelude")
dp.enable_features("contrib")
# OpenDP 0.13 names it make_basic_composition (from_opendp reads either name)
compose = getattr(dp.c, "make_composition", None) or dp.c.make_basic_composition
FLOATS = (dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float))


def test_pure_blocks_add_their_epsilons_as_opendp_composes_them():
    parts = [dp.m.make_laplace(*FLOATS, scale=2.0), dp.m.make_laplace(*FLOATS, scale=0.5)]
    comp = Composition([dpsbi.mechanisms.from_opendp(m, 1.0) for m in parts])
    total = comp.privacy()
    assert total.delta == 0 and total.rho is None and "basic" in total.rule
    assert comp.epsilon == total.epsilon == pytest.approx(compose(parts).map(1.0), rel=1e-12)


def test_zcdp_blocks_add_their_rho_and_convert_as_opendp_does():
    """A Laplace block (pure, rho = epsilon^2 / 2) and two Gaussian blocks: OpenDP composes them in zCDP and
    converts at delta = 2e-6 (make_zCDP_to_approxDP); with one Gaussian, the basic composition is tighter."""
    laplace = dp.m.make_laplace(*FLOATS, scale=20.0)
    gaussian = dp.m.make_gaussian(*FLOATS, scale=3.0)
    composed = compose([dp.c.make_pureDP_to_zCDP(laplace), gaussian, gaussian])
    blocks = [Laplace.from_scale(20.0, 1.0), Gaussian.from_sigma(3.0, 1.0, delta=1e-6)]
    comp = Composition(blocks + blocks[1:])
    total = comp.privacy()
    assert total.rho == pytest.approx(composed.map(1.0), rel=1e-12) and total.delta == pytest.approx(2e-6)
    curve = dp.c.make_zCDP_to_approxDP(composed).map(1.0)
    assert total.epsilon == pytest.approx(curve.epsilon(2e-6), rel=1e-9) and "zCDP" in total.rule
    assert total.epsilon < sum(b.epsilon for b in comp.blocks)  # tighter than adding the blocks' epsilons
    assert comp.rho == total.rho and comp.epsilon == total.epsilon
    one = Composition(blocks).privacy()
    assert "basic" in one.rule and one.epsilon == pytest.approx(blocks[0].epsilon + blocks[1].epsilon)
    assert one.epsilon < zcdp_epsilon(one.rho, 1e-6)


def test_approximate_blocks_without_rho_compose_basically():
    from dpsbi.mechanisms import SmoothSensitivityLaplace

    smooth = SmoothSensitivityLaplace(1.0, 1e-6, upper=10.0, n=50, statistic="median")
    total = Composition([smooth, Laplace(0.5, 1.0)]).privacy()
    assert (total.epsilon, total.delta, total.rho) == (pytest.approx(1.5), 1e-6, None)


def test_with_epsilon_splits_the_budget_in_the_same_proportions():
    pure = Composition([Laplace(0.5, 1.0), DiscreteLaplace(1.5, 1.0)])
    again = pure.with_epsilon(4.0)
    assert again.epsilon == pytest.approx(4.0) and [b.epsilon for b in again.blocks] == pytest.approx(
        [1.0, 3.0]
    )
    zcdp = Composition([Gaussian(1.0, 1e-6, 1.0), DiscreteGaussian(2.0, 1e-6, 1.0)])
    half = zcdp.with_epsilon(zcdp.epsilon / 2)
    assert half.epsilon == pytest.approx(zcdp.epsilon / 2, rel=1e-9)
    ratios = [b.epsilon / a.epsilon for a, b in zip(zcdp.blocks, half.blocks)]
    assert ratios[0] == pytest.approx(ratios[1], rel=1e-9)
    batched = pure.with_epsilon(torch.tensor([2.0, 4.0]).reshape(2, 1, 1))
    u = torch.rand(2, 1, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    s = torch.zeros(2, 1, 2, dtype=torch.float64)
    rows = [pure.with_epsilon(e).sample(s[i], u[i]) for i, e in enumerate((2.0, 4.0))]
    assert torch.allclose(batched.sample(s, u), torch.stack(rows))
    # every block takes a tensor of epsilons now (the discrete Gaussian too), but a zCDP total is re-calibrated
    # by a root search, one value at a time
    assert "not all pure epsilon-DP" in zcdp.epsilon_range_problem and pure.epsilon_range_problem is None
    # ... so a tensor of epsilons is refused there: its proportional split missed the total (3.02 for 3)
    with pytest.raises(ValueError, match="cannot take a tensor of epsilons: its blocks are not all pure"):
        zcdp.with_epsilon(torch.tensor([3.0]))


def test_with_epsilon_refuses_a_bad_epsilon_before_the_root_search():
    zcdp = Composition([Laplace(1.0, 1.0), Gaussian(1.0, 1e-6, 1.0)])
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"^epsilon must be a finite number > 0, got {bad}$"):
            zcdp.with_epsilon(bad)
    with pytest.raises(ValueError, match="got -1.0$"):  # the value given, not a block's share of it
        Composition([Laplace(1.0, 1.0), Laplace(1.0, 1.0)]).with_epsilon(-1.0)
    # a total out of the blocks' reach names the total asked for, not only the share the search tried
    with pytest.raises(
        ValueError, match=r"^Composition.with_epsilon\(1e\+09\): its blocks cannot be re-calibrated"
    ):
        zcdp.with_epsilon(1e9)


def test_log_prob_refuses_the_wrong_widths():
    comp = Composition([Laplace(1.0, 1.0), DiscreteGaussian(sigma=1.0)])
    for width in (1, 3):
        with pytest.raises(
            ValueError, match=f"^y must have last dimension 2 for Composition, got shape \\(1, {width}\\)$"
        ):
            comp.log_prob(torch.zeros(1, width), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="^s must have last dimension 2 for Composition"):
        comp.log_prob(torch.zeros(1, 2), torch.zeros(1, 3))


def test_repr_at_a_tensor_of_epsilons():
    pure = Composition([Laplace(0.5, 1.0), DiscreteLaplace(1.5, 1.0)])
    text = repr(pure.with_epsilon(torch.tensor([2.0, 4.0]).reshape(2, 1)))
    assert text.startswith("Composition([Laplace(dim=1, epsilon=tensor(0.5, 1), ")
    assert "DiscreteLaplace(dim=1, epsilon=tensor(1.5, 3), sensitivity=1, scale=tensor(" in text


# ---- identity, lattices, refusals -------------------------------------------------------------------------------


def test_identity_records_every_block():
    ident = mechanism_identity(mixed())
    assert [b["type"] for b in ident["blocks"]] == ["Laplace", "DiscreteGaussian", "PostProcessed"]
    assert (
        ident["blocks"][2]["inner"]["type"] == "DiscreteLaplace"
        and ident["blocks"][2]["step"] == "nonnegative"
    )
    other = Composition([*mixed().blocks[:2], PostProcessed(DiscreteLaplace(1.0, 2.0, 1), nonnegative)])
    assert any(
        d.startswith("blocks") and "sensitivity" in d for d in differences(ident, mechanism_identity(other))
    )


def test_only_the_integer_blocks_are_dequantized():
    comp = mixed()
    assert comp.lattices == (None, None, 1.0, 1.0) and comp.lattice is None
    y = torch.zeros(3, 4, dtype=torch.float64)
    v = torch.full((3, 2), 0.25, dtype=torch.float64)
    assert dequantized(y, comp, v)[0].tolist() == [0.0, 0.0, 0.25, 0.25]
    assert noise_uniforms(3, comp, 4, dequantize=True).shape == (3, 4, 6)  # noise, then 2 cell offsets
    whole = Composition([DiscreteLaplace(1.0, 1.0), DiscreteGaussian(sigma=2.0)])
    assert whole.lattice == 1.0 and dequantized(y[:, :2], whole, v)[0].tolist() == [0.25, 0.25]


def test_refusals_name_the_block():
    census = PostProcessed(DiscreteGaussian(sigma=2.0, dim=3), consistent_total)
    comp = Composition([Laplace(1.0, 1.0), census])
    assert not comp.has_log_prob
    with pytest.raises(IntractableLikelihood, match="^block 1 of the composition: rejection_abc") as error:
        comp.require_log_prob("rejection_abc")
    with pytest.raises(IntractableLikelihood, match="block 1"):
        comp.log_prob(torch.zeros(1, 4), torch.zeros(1, 4))
    clamped = Composition([Laplace(1.0, 1.0), PostProcessed(Laplace(1.0, 1.0), nonnegative)])
    with pytest.raises(ValueError, match="^block 1 of the composition: SPLE") as flow:
        clamped.require_likelihood_flow("SPLE")
    with pytest.raises(
        ValueError, match="^block 0 of the composition: DiscreteLaplace adds integer"
    ) as inputs:
        Composition([DiscreteLaplace(1.0, 1.0)]).sample(torch.tensor([[0.5]]))
    with pytest.raises(TypeError, match="block 1 is a float"):
        Composition([Laplace(1.0, 1.0), 2.0])
    with pytest.raises(TypeError, match="non-empty list"):
        Composition([])
    assert all("\n" not in str(e.value) for e in (error, flow, inputs))


# ---- SPPE and SPLE on a composed release ------------------------------------------------------------------------


def dp_mean(theta, generator):
    """A normal model's clipped sum and count of 20 records, the count held twice (by two curators)."""
    x = (theta[:, :1] + torch.randn(theta.shape[0], 20, generator=generator, dtype=theta.dtype)).clamp(-3, 3)
    count = torch.full_like(theta[:, :1], 20.0)
    return torch.cat([x.sum(-1, keepdim=True), count, count], -1)


def composed_task():
    mechanism = Composition([Laplace.from_scale((6.0, 2.0), (6.0, 1.0)), DiscreteGaussian.from_rho(0.5)])
    return dpsbi.from_simulator(normal([0.0], [1.0]), dp_mean, mechanism, [[5.0, 21.0, 19.0]])


TINY = dict(rounds=1, sims_per_round=60, inner_samples=4, flow=dict(transforms=2, hidden=8), progress=False)


@pytest.mark.parametrize("method", ["SPPE", "SPLE"])
def test_a_composed_release_fits_and_its_step_traces_whole(method, step_traces_whole):
    task = composed_task()
    assert task.epsilon == task.mechanism.epsilon and task.dim_s == 3
    training = dict(max_epochs=1, accelerator="cpu")
    estimator = getattr(dpsbi, method)(task, training=training, **TINY)
    posterior = estimator.run()
    if method == "SPLE":
        assert estimator.dequantize and posterior.dequantized  # the count's block only
    draws = posterior.sample((20,), seed=0)
    assert draws.shape == (20, 1) and bool(torch.isfinite(draws).all())
    step_traces_whole(estimator, 0)
