"""ABCDP (Park et al. 2021) and its uniform-mixture toy: SVT flips (Prop. 1), privacy accounting (Thm. 1),
MMD sensitivity (Lemma 1), and agreement with exact rejection ABC at large epsilon."""

import math
from functools import partial

import pytest
import torch
from scipy import integrate, stats
from torch.distributions import Independent, Normal

import dpsbi
from dpsbi.baselines.abcdp import (
    SparseVector,
    abcdp,
    abcdp_epsilon,
    abcdp_noise_scale,
    flip_probability,
    gaussian_mmd,
    mmd_sensitivity,
    sample_prior,
)
from dpsbi.tasks.uniform_mixture import mean_embedding, median_bandwidth, sample_mixture, spectral_quadrature

pytestmark = pytest.mark.usefixtures("float64")
GEN = lambda seed=0: torch.Generator().manual_seed(seed)  # noqa: E731


def binomial_ok(hits: torch.Tensor, trials: int, p: torch.Tensor, z: float = 4.0) -> bool:
    """Whether the empirical rates ``hits / trials`` lie within ``z`` binomial standard errors of ``p``."""
    se = (p * (1 - p) / trials).sqrt()
    return bool(((hits / trials - p).abs() <= z * se + 1e-12).all())


# --- Proposition 1 and the SVT state -------------------------------------------------------------------


def test_flip_probability_matches_the_laplace_difference_by_quadrature():
    b = 0.3
    for gap in [0.0, 0.1, 0.5, 1.7]:
        # P(Lap(b) - Lap(2b) > gap) = int f_m(x) P(v < x - gap) dx
        integrand = lambda x: stats.laplace.pdf(x, scale=b) * stats.laplace.cdf(x - gap, scale=2 * b)  # noqa: E731
        exact, _ = integrate.quad(integrand, -40, 40, points=[0, gap], limit=200)
        assert flip_probability(torch.tensor(0.2 + gap), 0.2, b).item() == pytest.approx(exact, abs=1e-8)
        assert flip_probability(torch.tensor(0.2 - gap), 0.2, b).item() == pytest.approx(exact, abs=1e-8)
    assert flip_probability(torch.tensor([0.2, 0.3]), 0.2, 0.0).tolist() == [0.0, 0.0]


def test_empirical_flip_rate_matches_proposition_1():
    epsilon_abc, b, reps = 0.5, 0.1, 3000
    rho = epsilon_abc + torch.linspace(-0.5, 0.5, 21)
    exact = rho <= epsilon_abc
    flips = torch.zeros(21)
    for rep in range(reps):  # c = T and no resampling: every query is answered with the same threshold noise
        accepted, answered = SparseVector(
            epsilon_abc, b, num_accepted=21, resample=False, generator=GEN(rep)
        )(rho)
        assert answered == 21
        flips += accepted != exact
    p = flip_probability(rho, epsilon_abc, b)
    assert binomial_ok(flips, reps, p), (flips / reps, p)
    assert flips.sum() > 0.5 * p.sum() * reps  # the noise is really there


@pytest.mark.parametrize("resample", [False, True])
def test_threshold_noise_is_shared_or_redrawn_after_an_acceptance(resample):
    """Two queries at distance 1 from the threshold, c = 2: P(both accepted) is P(one)^2 when the threshold
    is redrawn after the first acceptance (RESAMPLE) and int f_m(m) F_v(e + m - rho)^2 dm when it is shared
    (0.118 against 0.153: 7 standard errors apart at 4000 repetitions)."""
    epsilon_abc, b, reps = 0.0, 1.0, 4000
    rho = torch.tensor([1.0, 1.0])
    svt = lambda rep: SparseVector(epsilon_abc, b, num_accepted=2, resample=resample, generator=GEN(rep))  # noqa: E731
    both = sum(bool(svt(rep)(rho)[0].all()) for rep in range(reps))
    density = lambda m: stats.laplace.pdf(m, scale=b)  # noqa: E731  (threshold noise)
    accept = lambda m: stats.laplace.cdf(epsilon_abc + m - 1.0, scale=2 * b)  # noqa: E731  (given the threshold noise)
    if resample:
        expected = integrate.quad(lambda m: density(m) * accept(m), -50, 50, points=[0])[0] ** 2
    else:
        expected = integrate.quad(lambda m: density(m) * accept(m) ** 2, -50, 50, points=[0])[0]
    assert binomial_ok(torch.tensor(float(both)), reps, torch.tensor(expected)), (both / reps, expected)


def test_sparse_vector_stops_at_the_c_th_acceptance_across_chunks():
    svt = SparseVector(epsilon_abc=1.0, noise_scale=0.0, num_accepted=3, resample=True)
    accepted, answered = svt(torch.tensor([2.0, 0.5, 3.0, 0.1]))
    assert accepted.tolist() == [False, True, False, True] and answered == 4 and not svt.done
    accepted, answered = svt(torch.tensor([5.0, 0.9, 0.2, 0.3]))
    assert accepted.tolist() == [False, True, False, False] and answered == 2 and svt.done


# --- Theorem 1 -------------------------------------------------------------------------------------------


def test_privacy_accounting_of_theorem_1():
    # (c + 1) Delta / b without RESAMPLE, 2 c Delta / b with it
    assert abcdp_epsilon(10, sensitivity=0.01, noise_scale=0.1, resample=False) == pytest.approx(1.1)
    assert abcdp_epsilon(10, sensitivity=0.01, noise_scale=0.1, resample=True) == pytest.approx(2.0)
    assert (
        abcdp_epsilon(1, 0.5, 2.0, resample=False)
        == abcdp_epsilon(1, 0.5, 2.0, resample=True)
        == pytest.approx(0.5)
    )
    assert abcdp_epsilon(5, 0.1, 0.0, resample=True) == math.inf
    # Theorem 2's scales for MMD (B_k = 1) on N = 5000 records, c = 100, epsilon_total = 1
    delta = mmd_sensitivity(5000)
    assert delta == pytest.approx(4e-4)
    assert abcdp_noise_scale(1.0, 100, delta, resample=False) == pytest.approx(2 * 101 / 5000)
    assert abcdp_noise_scale(1.0, 100, delta, resample=True) == pytest.approx(4 * 100 / 5000)
    assert abcdp_noise_scale(math.inf, 100, delta, resample=True) == 0.0
    for bad in [
        dict(num_accepted=0),
        dict(num_accepted=2.5),
        dict(epsilon_total=0.0),
        dict(sensitivity=-1.0),
    ]:
        kwargs = dict(epsilon_total=1.0, num_accepted=3, sensitivity=0.1, resample=False) | bad
        with pytest.raises(ValueError):
            abcdp_noise_scale(**kwargs)


# --- Lemma 1: sensitivity of the distances ---------------------------------------------------------------


def test_gaussian_mmd_moves_by_at_most_its_sensitivity_between_neighbouring_datasets():
    g, n, trials = GEN(1), 25, 200
    observed = torch.randn(trials, n, 2, generator=g)
    neighbour = observed.clone()
    neighbour[:, 0] = 6 * torch.randn(trials, 2, generator=g)  # one record replaced, often far away
    simulated = torch.randn(trials, 30, 2, generator=g) + torch.rand(trials, 1, 2, generator=g)
    change = torch.stack(
        [
            (gaussian_mmd(a, simulated[i : i + 1], 1.0) - gaussian_mmd(b, simulated[i : i + 1], 1.0)).abs()[0]
            for i, (a, b) in enumerate(zip(observed, neighbour))
        ]
    )
    bound = mmd_sensitivity(n)
    assert (change <= bound).all() and change.max() > 0.25 * bound, (change.max(), bound)


def test_uniform_mixture_summary_distance_is_the_gaussian_mmd_with_bounded_sensitivity():
    bandwidth = median_bandwidth()
    assert 0.9 < bandwidth < 1.5  # the median pairwise distance of prior-predictive data on [0, 5]
    frequencies, weights = spectral_quadrature(bandwidth, 10)
    r = torch.linspace(-5, 5, 1001)
    kernel = (weights * torch.cos(r[:, None] * frequencies)).sum(-1)
    assert (
        weights.sum().item() == pytest.approx(1.0)
        and (kernel - torch.exp(-(r**2) / (2 * bandwidth**2))).abs().max() < 1e-6
    )

    g, n, trials = GEN(2), 200, 100
    theta = sample_prior(torch.distributions.Dirichlet(torch.ones(5)), 2 * trials, g)
    x, y = sample_mixture(theta, n, g).split(trials)
    neighbour = x.clone()
    neighbour[:, 0] = 5 * torch.rand(trials, generator=g)
    embed = partial(mean_embedding, frequencies=frequencies, weights=weights)
    distance = (embed(x) - embed(y)).norm(dim=-1)
    change = (distance - (embed(neighbour) - embed(y)).norm(dim=-1)).abs()
    assert (change <= 2 / n).all() and change.max() > 0.25 * 2 / n
    exact = torch.stack(
        [gaussian_mmd(a[:, None], b[None, :, None], bandwidth)[0] for a, b in zip(x[:10], y[:10])]
    )
    assert torch.allclose(distance[:10], exact, atol=1e-6)


# --- The uniform-mixture task ----------------------------------------------------------------------------


def test_uniform_mixture_task():
    task = dpsbi.tasks.load("uniform_mixture", epsilon=1.0, n_obs=1000, seed=3)
    assert "uniform_mixture" in dpsbi.tasks.names()
    assert (task.dim_theta, task.dim_unconstrained, task.dim_s) == (5, 4, 20)
    assert task.mechanism.sensitivity == pytest.approx(2 / 1000) and task.s_obs.shape == task.y_obs.shape == (
        1,
        20,
    )
    assert (task.y_obs - task.s_obs).abs().max() < 6 * task.mechanism.sigma
    assert torch.equal(task.s_obs, dpsbi.tasks.load("uniform_mixture", n_obs=1000, seed=3).s_obs)
    theta = task.transform(torch.randn(7, 4))
    assert task.simulate(theta, GEN()).shape == (7, 20)
    x = sample_mixture(task.true_theta, 20000, GEN())
    counts = torch.stack([((x >= i) & (x < i + 1)).sum() for i in range(5)]).double()
    assert binomial_ok(counts, 20000, task.true_theta[0])
    user = dpsbi.tasks.load("uniform_mixture", y_obs=task.y_obs)
    assert user.s_obs is None and user.true_theta is None
    with pytest.raises(ValueError, match="confidential data"):
        abcdp(user, 10, 1.0, 0.1, progress=False)


# --- ABCDP against rejection ABC ---------------------------------------------------------------------------


def gaussian_abc_posterior_mean(s_obs: float, h: float) -> float:
    """Exact mean of rejection ABC with threshold h for theta ~ N(0, 1), s ~ N(theta, 1), rho = |s - s_obs|."""
    weight = lambda t: stats.norm.pdf(t) * (stats.norm.cdf(s_obs + h - t) - stats.norm.cdf(s_obs - h - t))  # noqa: E731
    return integrate.quad(lambda t: t * weight(t), -10, 10)[0] / integrate.quad(weight, -10, 10)[0]


@pytest.mark.parametrize(
    "epsilon_total, resample, agrees",
    [(math.inf, False, True), (2e4, False, True), (2e4, True, True), (20.0, False, False)],
)
def test_abcdp_on_data_approaches_exact_rejection_abc_at_large_epsilon(epsilon_total, resample, agrees):
    s_obs, h, c = 1.5, 0.5, 2000
    result = abcdp(
        torch.tensor([[s_obs]]),
        c,
        epsilon_total,
        h,
        resample=resample,
        batch_size=4000,
        prior=Independent(Normal(torch.zeros(1), torch.ones(1)), 1),
        simulator=lambda theta, g: theta + torch.randn(theta.shape, generator=g),
        distance=lambda observed, s: (s - observed).abs()[:, 0],
        sensitivity=0.01,
        generator=GEN(4),
        progress=False,
    )
    samples = result.samples[:, 0]
    assert samples.shape == (c,) and result.info["accepted"] == c
    assert result.info["epsilon_total"] == pytest.approx(epsilon_total)
    error = abs(samples.mean().item() - gaussian_abc_posterior_mean(s_obs, h))
    assert (error < 4 * samples.std().item() / math.sqrt(c)) == agrees, error


def test_abcdp_on_uniform_mixture_couples_with_rejection_abc():
    """With one seed the runs share proposals and noise uniforms, so ABCDP at a large budget accepts the
    same draws as rejection ABC except where its answers flipped; at epsilon_total = 1 flips are frequent."""
    task = dpsbi.tasks.load("uniform_mixture", n_obs=1000)

    def run(epsilon_total):
        return abcdp(task, 40, epsilon_total, 0.08, batch_size=1000, generator=GEN(5), progress=False)

    plain, large, small = run(math.inf), run(100.0), run(1.0)
    assert plain.info["flips"] == 0 and plain.info["noise_scale"] == 0
    assert large.info["sensitivity"] == pytest.approx(2 / 1000) and large.info[
        "noise_scale"
    ] == pytest.approx(41 * 0.002 / 100)
    shared = (large.samples[:, None] == plain.samples[None]).all(-1).any(-1).sum().item()
    assert shared >= 40 - large.info["flips"] and large.info["flips"] < 10
    assert (plain.samples.mean(0) - task.true_theta).norm() < 0.75 * (
        task.prior.mean - task.true_theta
    ).norm()
    assert small.info["flips"] > 10 and small.info["proposals"] < plain.info["proposals"]


def test_clipping_and_clear_errors():
    data = torch.zeros(1, 1)
    kwargs = dict(
        prior=Independent(Normal(torch.zeros(1), torch.ones(1)), 1),
        simulator=lambda t, g: t,
        progress=False,
        generator=GEN(),
    )
    far = lambda observed, s: 100 + s[:, 0].abs()  # noqa: E731  (no bounded sensitivity)
    with pytest.raises(ValueError, match="no known sensitivity"):
        abcdp(data, 5, 1.0, 2.0, distance=far, **kwargs)
    clipped = abcdp(
        data, 5, math.inf, 2.0, distance=far, clip=1.0, **kwargs
    )  # min(rho, 1) <= 2: all accepted
    assert clipped.info["sensitivity"] == 1.0 and clipped.info["proposals"] == 5
    assert (
        abcdp(data, 5, 3.0, 2.0, distance=far, sensitivity=5.0, clip=1.0, **kwargs).info["sensitivity"] == 1.0
    )
    with pytest.raises(ValueError, match="needs simulator, distance"):
        abcdp(data, 5, 1.0, 2.0, prior=kwargs["prior"])
    with pytest.raises(ValueError, match="one value per proposal"):
        abcdp(data, 5, 1.0, 2.0, distance=lambda observed, s: s, sensitivity=1.0, **kwargs)
    with pytest.raises(TypeError, match="Task or the observed data"):
        abcdp([0.0], 5, 1.0, 2.0)
    with pytest.warns(UserWarning, match="accepted 0 of the 5"):
        result = abcdp(
            data, 5, math.inf, 2.0, distance=far, sensitivity=1.0, max_proposals=50, batch_size=20, **kwargs
        )
    assert result.samples.shape == (0, 1) and result.num_simulations == 50 and result.info["proposals"] == 50
