"""A small area's age x sex table released like the 2020 Census: discrete Gaussian noise on every cell at a
production zCDP level, clamped at 0, the total population held invariant; its exact likelihood.

The model. ``N`` people (``population``, public and exact: the invariant) fall into ``C = 2 G`` cells, ``G``
age groups by sex, with probabilities from three parameters ``theta = (age_slope, age_curvature,
male_log_odds)``: ages on ``[0, 100)`` have density ``exp(b1 z + b2 z^2)``, ``z = (age - 40) / 40``, integrated
over each group (Gauss-Legendre, 8 nodes a group), and a person is male with probability
``sigmoid(male_log_odds)``. The confidential table is ``s ~ Multinomial(N, p(theta))``; the release is
``y = max(0, s + Z)`` with ``Z_i`` i.i.d. discrete Gaussian (:class:`~dpsbi.mechanisms.DiscreteGaussian`, then
:data:`~dpsbi.mechanisms.nonnegative`). Cells are ordered males first, each sex by age.

The age groups (``age_groups``): ``None`` gives the 23 groups of the 2020 Census DHC table P12 ("Sex by age":
under 5, 5-9, 10-14, 15-17, 18-19, 20, 21, 22-24, 25-29, ..., 60-61, 62-64, 65-66, 67-69, ..., 80-84, 85 and
over, here 85-99), 46 cells; an integer ``G`` gives ``G`` groups of equal width (``G = 5, 50, 500``: releases of
10, 100 and 1000 cells); a list gives the groups' lower bounds (increasing, from 0, below 100).

The privacy level. The 2020 Census measured each query of its TopDown algorithm with the discrete Gaussian
mechanism at ``sigma^2 = 1 / rho_q``, ``rho_q = rho_total x geolevel share x query share`` under bounded
neighbours (one person's record changed: L2 sensitivity ``sqrt 2`` for a table, so ``rho_q = 2 / (2 sigma^2)``).
The default ``rho`` is the P.L. 94-171 production setting of the block-group "detailed" query, the table
measured at block-group level with the largest share: ``rho_total = (542 / 339)^2 = 2.556`` for persons
(``global_scale = 339/542``), block-group share ``1256/4099``, query share ``1288/4099``, so
``rho = 0.2461`` and **sigma = 2.016** per cell (source: uscensusbureau/DAS_2020_Redistricting_Production_Code,
``configs/production/pl94/person_default.ini`` and ``person_US.ini``, strategy
``ProductionCandidate20210527US_mult8_add02_dsepJune3`` in ``programs/strategies/strategies.py``; sigma from
``getAdjustedInverseScalePerQuery`` in ``programs/engine/engine_utils.py``). Other per-table levels of that
run: block "detailed" 0.099 (sigma 3.18), tract "detailed" 0.050 (sigma 4.46), tract "hispanic x cenrace"
0.202 (sigma 2.23). ``epsilon`` (with ``delta``) calibrates instead of ``rho``; the task's ``epsilon`` is the
table's ``(epsilon, delta)`` by the zCDP conversion, ``delta = 1e-10`` as the Census reported. A posterior
amortized over a range of ``rho`` is one trained with ``epsilon_range`` over the matching epsilons
(``task.mechanism.with_rho(rho).epsilon``; the discrete Gaussian re-calibrates every simulation on the device).

The exact likelihood (:class:`CensusLikelihood`). Given the total ``N``, ``Multinomial(s; N, p) = prod_i
Pois(s_i; N p_i) / Pois(N; N)`` on ``sum_i s_i = N``, so ``p(y | theta) = (f_1 * ... * f_C)(N) / Pois(N; N)``
with ``f_i(k) = Pois(k; N p_i) q(y_i | k)``, ``q`` the clamped discrete Gaussian's pmf (the mechanism's own
``coordinate_log_prob``): a C-fold convolution of nonnegative vectors, computed directly (no FFT: every
entry keeps its relative precision) on a pairwise tree with per-node rescaling, each factor trimmed where it
is below ``e^-50`` of its peak (after an exponential tilt that puts ``N`` in the bulk of the sum, where it is
not already) and every partial sum trimmed to the values from which ``N`` is still reachable. Checked against
brute-force enumeration and exact-match rejection (tests/test_census.py).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
from scipy.special import gammaln
from torch import Tensor
from torch.distributions import MultivariateNormal

from ..mechanisms import DiscreteGaussian, PostProcessed, nonnegative
from ..mechanisms.base import check_integer
from . import register
from .base import Task, observed_release

#: Lower bounds of the 23 age groups of the 2020 Census DHC table P12 (the last, 85 and over, ends at MAX_AGE).
DHC_AGE_GROUPS = (0, 5, 10, 15, 18, 20, 21, 22, 25, 30, 35, 40, 45, 50, 55, 60, 62, 65, 67, 70, 75, 80, 85)
MAX_AGE = 100.0
AGE_CENTER, AGE_SCALE = 40.0, 40.0
#: The 2020 P.L. 94-171 production rho of the block-group "detailed" query (bounded neighbours): see the module.
RHO_2020 = float(Fraction(542, 339) ** 2 * Fraction(1256, 4099) * Fraction(1288, 4099))
PARAMETER_NAMES = ["age_slope", "age_curvature", "male_log_odds"]
TRUE_THETA = [-0.5, -1.0, -0.05]
PRIOR_SD = [1.0, 1.0, 0.5]
#: The largest table ``C (N + 1)`` of ``log q(y_i | k)`` the exact likelihood tabulates (800 MB of float64): past
#: it (a state's population) the task carries no ``exact_log_likelihood`` and references are simulated.
MAX_LIKELIHOOD_TABLE = 10**8
#: Each factor f_i of the convolution is trimmed where it is below e^-CUT of its peak (e^-50 = 2e-22).
CUT = 50.0
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(8)


def age_edges(age_groups) -> np.ndarray:
    """The groups' edges ``(G + 1,)`` on ``[0, MAX_AGE]`` for ``age_groups`` (``None``, a count or lower bounds)."""
    if age_groups is None:
        lower = np.asarray(DHC_AGE_GROUPS, dtype=np.float64)
    elif isinstance(age_groups, (int, np.integer)) and not isinstance(age_groups, bool):
        if age_groups < 1:
            raise ValueError(f"age_groups must be >= 1, got {age_groups}")
        lower = np.linspace(0.0, MAX_AGE, int(age_groups) + 1)[:-1]
    else:
        lower = np.asarray(age_groups, dtype=np.float64).reshape(-1)
        if (
            lower.size < 1
            or lower[0] != 0
            or (np.diff(lower) <= 0).any()
            or lower[-1] >= MAX_AGE
            or not np.isfinite(lower).all()
        ):
            raise ValueError(
                f"age_groups as lower bounds must increase from 0 and stay below {MAX_AGE:g}, got {list(lower)}"
            )
    return np.append(lower, MAX_AGE)


def cell_log_probs(theta: Tensor, edges: np.ndarray) -> Tensor:
    """``log p(theta)``: log cell probabilities ``(n, 2 G)`` (males then females, by age) for ``theta (n, 3)``,
    in ``theta``'s dtype (use float64 for the likelihood)."""
    lo, hi = torch.as_tensor(edges[:-1]), torch.as_tensor(edges[1:])
    half = (hi - lo) / 2
    ages = (lo + half)[:, None] + half[:, None] * torch.as_tensor(_NODES)  # (G, 8)
    log_w = torch.log(half)[:, None] + torch.log(torch.as_tensor(_WEIGHTS))
    z = ((ages - AGE_CENTER) / AGE_SCALE).to(theta)
    b1, b2, gamma = theta[:, 0, None, None], theta[:, 1, None, None], theta[:, 2, None]
    log_group = torch.logsumexp(b1 * z + b2 * z**2 + log_w.to(theta), -1)  # (n, G)
    log_age = torch.log_softmax(log_group, -1)
    male, female = torch.nn.functional.logsigmoid(gamma), torch.nn.functional.logsigmoid(-gamma)
    return torch.cat([log_age + male, log_age + female], -1)


def _simulator(population: int, edges: np.ndarray):
    """``s ~ Multinomial(population, p(theta))`` per row, as float64 counts ``(n, 2 G)`` (exact up to 2^53): cell by
    cell, ``s_i ~ Binomial(people left, p_i / sum_{j >= i} p_j)``, all rows at once, so a state's or the nation's
    population costs what a small area's does."""

    def simulate(theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        probs = cell_log_probs(theta.double(), edges).exp()
        tail = probs.flip(-1).cumsum(-1).flip(-1)  # sum_{j >= i} p_j
        share = (probs / tail).clamp(0.0, 1.0)
        left = torch.full(probs.shape[:1], float(population), dtype=torch.float64, device=theta.device)
        counts = []
        for cell in range(probs.shape[1] - 1):
            counts.append(torch.binomial(left, share[:, cell], generator=generator))
            left = left - counts[-1]
        return torch.stack([*counts, left], -1)

    return simulate


def exponential_tilt(log_f: np.ndarray, total: int) -> float:
    """The ``t`` with ``sum_i E_t[K_i] = total`` for ``K_i`` distributed as ``f_i(k) e^{t k}`` (``log_f (C, K + 1)``),
    by safeguarded Newton steps on the convex ``sum_i log sum_k f_i(k) e^{t k}``; 0 when ``total`` already lies
    within 3 standard deviations of the untilted sum's mean."""
    k = np.arange(log_f.shape[1], dtype=np.float64)
    t, low, high = 0.0, -math.inf, math.inf
    for step in range(100):
        a = log_f + t * k
        p = np.exp(a - a.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        mean = p @ k
        var = np.maximum(p @ (k * k) - mean**2, 0.0)
        gap, spread = float(mean.sum()) - total, math.sqrt(max(float(var.sum()), 1e-300))
        if (step == 0 and abs(gap) <= 3 * spread) or abs(gap) <= 1e-3 * spread:
            return t
        low, high = (t, high) if gap < 0 else (low, t)
        t_new = t - gap / spread**2
        if not low < t_new < high:  # Newton left the bracket: bisect (or widen an open side)
            t_new = (
                (low + high) / 2
                if math.isfinite(low) and math.isfinite(high)
                else t - math.copysign(1.0, gap)
            )
        t = t_new
    return t


def _windows(log_f: np.ndarray, peak: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's range ``[lo, hi]`` where ``log_f`` is within ``CUT`` of its ``peak`` (the rows are log-concave,
    so it is one interval), and ``exp(log_f - peak)`` on it, left-aligned and zero-padded: ``(C, width)``."""
    keep = log_f >= (peak - CUT)[:, None]
    lo = keep.argmax(1)
    hi = log_f.shape[1] - 1 - keep[:, ::-1].argmax(1)
    index = lo[:, None] + np.arange(int((hi - lo).max()) + 1)
    values = np.exp(np.take_along_axis(log_f, np.minimum(index, log_f.shape[1] - 1), 1) - peak[:, None])
    values[index > hi[:, None]] = 0.0
    return lo, hi, values


def log_convolution_at(log_f: np.ndarray, total: int) -> float:
    """``log (f_1 * f_2 * ... * f_C)(total)`` for nonnegative ``f_i`` on ``k = 0..K`` given by ``log_f (C, K + 1)``.

    Where ``total`` lies more than 3 standard deviations from the mean of the sum of ``K_i ~ f_i``, the factors
    are first tilted, ``f_i(k) e^{t k}`` with ``t`` from :func:`exponential_tilt` (on ``sum k_i = total`` the tilt
    multiplies the value by exactly ``e^{t total}``, which is divided out), so that ``total`` lies in the bulk
    of the sum; then each factor is trimmed where it is below ``e^-CUT`` of its peak (the trimmed
    mass changes the result by a relative ~``C e^-CUT``), and the factors are convolved directly on a pairwise
    tree (no FFT: every entry keeps its relative precision), each partial sum trimmed to the values from which
    ``total`` is reachable and rescaled to a peak of 1 (the scales kept in log space). ``-inf`` where ``total``
    is out of reach."""
    peak = log_f.max(1)
    if not np.isfinite(peak).all():
        return -math.inf
    lo, hi, window = _windows(log_f, peak)
    k = lo[:, None] + np.arange(window.shape[1])
    p = window / window.sum(1, keepdims=True)
    mean = (p * k).sum(1)
    gap, spread = float(mean.sum()) - total, math.sqrt(float((p * (k - mean[:, None]) ** 2).sum()))
    t = 0.0
    if abs(gap) > 3 * spread:  # total is far in a tail of the untilted sum: tilt, and trim again
        t = exponential_tilt(log_f, total)
        log_f = log_f + t * np.arange(log_f.shape[1], dtype=np.float64)
        peak = log_f.max(1)
        lo, hi, window = _windows(log_f, peak)
    nodes = [(int(a), int(b), window[i, : b - a + 1]) for i, (a, b) in enumerate(zip(lo, hi))]
    log_scale = float(peak.sum())
    while len(nodes) > 1:
        sum_lo, sum_hi = sum(n[0] for n in nodes), sum(n[1] for n in nodes)
        merged = []
        for (a_lo, a_hi, a), (b_lo, b_hi, b) in zip(nodes[0::2], nodes[1::2]):
            low, high = a_lo + b_lo, a_hi + b_hi
            # the other nodes' sum lies in [sum_lo - a_lo - b_lo, sum_hi - a_hi - b_hi]
            w_lo, w_hi = max(low, total - (sum_hi - high)), min(high, total - (sum_lo - low))
            if w_lo > w_hi:
                return -math.inf
            values = np.convolve(a, b)[w_lo - low : w_hi - low + 1]
            top = values.max()
            if not top > 0:
                return -math.inf
            merged.append((w_lo, w_hi, values / top))
            log_scale += math.log(top)
        if len(nodes) % 2:
            merged.append(nodes[-1])
        nodes = merged
    low, high, values = nodes[0]
    if not low <= total <= high or not values[total - low] > 0:
        return -math.inf
    return log_scale + math.log(values[total - low]) - t * total


class CensusLikelihood:
    """The exact ``log p(y | theta)`` of a :func:`census_table <make>` task at one release ``y (C,)``.

    ``log q(y_i | k)`` for ``k = 0..N`` is computed once (float64, from the task's mechanism: ``C (N + 1)``
    numbers, 8 MB for 1000 cells of N = 1000); each theta then costs one C-fold convolution
    (:func:`log_convolution_at`): about 1 ms for 46 cells of N = 1000 and 20 ms for 1000 cells, on one core."""

    def __init__(self, population: int, edges: np.ndarray, mechanism, y: Tensor) -> None:
        y = torch.as_tensor(y, dtype=torch.float64).reshape(-1)
        if y.shape[0] != 2 * (len(edges) - 1):
            raise ValueError(f"a release of {2 * (len(edges) - 1)} cells was expected, got {y.shape[0]}")
        self.population, self.edges = int(population), edges
        k = torch.arange(self.population + 1, dtype=torch.float64)
        self.log_q = mechanism.coordinate_log_prob(y[:, None], k[None, :]).numpy()  # (C, N + 1)
        self.log_k_factorial = gammaln(np.arange(self.population + 1) + 1.0)
        n = self.population
        self.log_pois_total = n * math.log(n) - n - math.lgamma(n + 1) if n > 0 else 0.0

    def __call__(self, theta: Tensor) -> Tensor:
        """``log p(y | theta)`` for ``theta (n, 3)``, shape ``(n,)`` (float64)."""
        theta = torch.as_tensor(theta, dtype=torch.float64).reshape(-1, 3)
        log_lam = (cell_log_probs(theta, self.edges) + math.log(self.population)).numpy()  # (n, C)
        k = np.arange(self.population + 1, dtype=np.float64)
        out = np.empty(theta.shape[0])
        for row, lam in enumerate(log_lam):
            log_pois = k * lam[:, None] - np.exp(lam)[:, None] - self.log_k_factorial
            out[row] = log_convolution_at(log_pois + self.log_q, self.population) - self.log_pois_total
        return torch.from_numpy(out)


def _release(population: int, edges: np.ndarray, mechanism, theta: list[float], seed: int) -> Tensor:
    """The default release at ``theta``: cells from numpy's legacy ``RandomState(seed)`` (a frozen stream, so the
    release is the same on every machine and version), noise by the mechanism's inverse CDF of its uniforms."""
    rng = np.random.RandomState(seed)
    probs = cell_log_probs(torch.tensor([theta], dtype=torch.float64), edges).exp()[0].numpy()
    s = rng.multinomial(population, probs / probs.sum()).astype(np.float64)
    u = rng.random_sample(s.shape[0])
    return mechanism.sample(
        torch.from_numpy(s)[None], torch.from_numpy(u)[None]
    )  # float64: counts stay exact


@register("census_table")
def make(
    epsilon: float | None = None,
    y_obs=None,
    seed: int = 0,
    rho: float | None = None,
    delta: float = 1e-10,
    population: int = 1000,
    age_groups: int | list[float] | None = None,
    true_theta: list[float] | None = None,
) -> Task:
    """A small area's ``population`` people in age groups x sex (46 cells by default: the DHC P12 groups),
    theta = (age_slope, age_curvature, male_log_odds) with prior ``N(0, diag(1, 1, 0.25))``, true theta
    (-0.5, -1, -0.05), cells released with discrete Gaussian noise at zCDP ``rho`` (default the 2020
    production block-group table level, 0.2461: sigma = 2.016; or calibrated from ``epsilon`` at ``delta``)
    clamped at 0; the total is public. ``y_obs=None``: the release drawn from the true theta with ``seed``
    (numpy's frozen legacy stream); ``"simulate"``: drawn with torch's generator; or your own release.
    ``task.exact_log_likelihood(theta, y, mechanism=None)`` is the exact likelihood (:class:`CensusLikelihood`;
    ``mechanism``: the task's, or another privacy level of it, e.g. ``task.mechanism.with_epsilon(e)``), where its
    table of ``cells (population + 1)`` values fits :data:`MAX_LIKELIHOOD_TABLE` (absent beyond: a state's
    population).
    Counts, summaries and releases are float64, exact at any population up to 2^53."""
    if epsilon is not None and rho is not None:
        raise ValueError("census_table takes epsilon (with delta) or rho, not both")
    population = check_integer("population", population)
    if population > 2**53:  # float64 holds every count up to it, and not every one beyond
        raise ValueError(
            f"population must be at most 2^53 (counts are float64, exact up to it), got {population}"
        )
    edges = age_edges(age_groups)
    cells = 2 * (len(edges) - 1)
    sensitivity = math.sqrt(2.0)  # bounded neighbours: one person moves from one cell to another
    if epsilon is not None:
        inner = DiscreteGaussian(epsilon, delta, sensitivity=sensitivity, dim=cells)
    else:
        inner = DiscreteGaussian.from_rho(RHO_2020 if rho is None else rho, sensitivity, cells, delta)
    mechanism = PostProcessed(inner, nonnegative)
    dtype = torch.get_default_dtype()
    prior = MultivariateNormal(
        torch.zeros(3, dtype=dtype), torch.diag(torch.tensor(PRIOR_SD, dtype=dtype) ** 2)
    )
    theta_true = list(TRUE_THETA if true_theta is None else true_theta)
    simulate = _simulator(population, edges)

    if y_obs is None:
        release = _release(population, edges, mechanism, theta_true, seed)
    else:

        def simulate_obs(generator: torch.Generator) -> Tensor:
            s = simulate(torch.tensor([theta_true], dtype=dtype), generator)
            return mechanism.sample(s, generator=generator)

        release = observed_release("census_table", inner.epsilon, y_obs, {}, simulate_obs, seed)
    task = Task(
        name="census_table",
        prior=prior,
        simulator=simulate,
        mechanism=mechanism,
        epsilon=inner.epsilon,
        y_obs=release,
        true_theta=torch.tensor([theta_true], dtype=dtype),
        parameter_names=list(PARAMETER_NAMES),
        description=(
            f"Census table: {population} people in {cells // 2} age groups x sex ({cells} cells), total invariant; "
            f"discrete Gaussian noise per cell at rho={inner.rho:.4g} (sigma={inner.sigma:.4g}), clamped at 0."
        ),
    )
    likelihoods: dict[tuple, tuple[object, CensusLikelihood]] = {}

    def exact_log_likelihood(theta: Tensor, y: Tensor | None = None, mechanism=None) -> Tensor:
        """Exact ``log p(y | theta)`` ``(n,)`` (float64) at release ``y`` (default ``task.y_obs``) through
        ``mechanism`` (default the task's). The last release and mechanism's table is kept for the next call."""
        mechanism = task.mechanism if mechanism is None else mechanism
        y = task.y_obs if y is None else task.check_release(y)
        key = (tuple(y.reshape(-1).tolist()), id(mechanism))
        if key not in likelihoods:
            likelihoods.clear()  # the mechanism is kept with its table, so that its id is not reused meanwhile
            likelihoods[key] = (mechanism, CensusLikelihood(population, edges, mechanism, y))
        return likelihoods[key][1](theta)

    if cells * (population + 1) <= MAX_LIKELIHOOD_TABLE:  # read by dpsbi.experiment.reference ("likelihood")
        task.exact_log_likelihood = exact_log_likelihood
    return task
