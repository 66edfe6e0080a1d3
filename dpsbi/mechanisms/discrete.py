"""Discrete Laplace (two-sided geometric) and discrete Gaussian mechanisms on integer statistics, and their
privacy accounting.

- :class:`DiscreteLaplace`: ``y = s + n``, ``P(n = k) = (1 - p) / (1 + p) p^|k|`` with ``p = e^{-1/t}`` and
  scale ``t = sensitivity / epsilon`` (``sensitivity``: L1); ``epsilon``-DP (Ghosh, Roughgarden & Sundararajan
  2012; OpenDP's ``make_laplace`` / ``make_geometric`` on integers).
- :class:`DiscreteGaussian`: ``P(n = k) = e^{-k^2 / (2 sigma^2)} / Z`` (Canonne, Kamath & Steinke 2020, "CKS";
  OpenDP's ``make_gaussian`` on integers). It is ``rho``-zCDP with ``rho = Delta_2^2 / (2 sigma^2)`` (CKS
  Thm. 4, and Thm. 14 for vectors with L2 sensitivity ``Delta_2``). Its ``(epsilon, delta)`` curve is CKS
  Thm. 7 exactly for a scalar statistic, and the zCDP conversion (CKS Cor. 13 / Prop. 12) for a vector.

Both draw their noise by inverse CDF (``y = G(s, u)``, for RQMC), vectorized on the device: the discrete
Laplace quantile in closed form, the discrete Gaussian's by ``searchsorted`` in a CDF table over
``|k| <= 10 sigma + 2`` (the mass outside it is below 1e-21), built once and cached per device and dtype.
Both also take a tensor of epsilons (``with_epsilon``), one per row, for training over a range of privacy
levels: the discrete Gaussian then calibrates each row on the device (:func:`discrete_gaussian_sigmas`,
:func:`zcdp_rhos`) and searches each entry's quantile on exact tails (:func:`discrete_gaussian_quantiles`).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from scipy.optimize import brentq, minimize_scalar
from scipy.special import logsumexp
from torch import Tensor

from .base import (
    AdditiveNoise,
    Mechanism,
    check_exact_integers,
    check_integer,
    check_positive,
    check_scale,
    show,
)
from .epsilon import batched_copy, epsilons, readable
from .gaussian import analytic_sigma
from .tables import cell, table, tabled

#: The largest discrete Gaussian sigma: its inverse-CDF table covers ``|k| <= 10 sigma + 2`` (2e7 entries here).
MAX_SIGMA = 1e6
#: Elements x terms evaluated at once by the exact far-tail sums of :meth:`DiscreteGaussian.noise_log_cdf`.
_CHUNK = 1 << 22


def _check_sensitivity(sensitivity: float, integer: bool) -> float:
    """``sensitivity`` as a float ``>= 1``, and a whole number where ``integer``: the L1 sensitivity of an integer
    statistic (:class:`DiscreteLaplace`), the L2 sensitivity of a scalar one (:class:`DiscreteGaussian` with ``dim =
    1``, whose exact accounting, CKS Thm. 7, sums over integer shifts); a vector's L2 sensitivity need not be."""
    sensitivity = check_positive("sensitivity", sensitivity)
    if sensitivity < 1:
        raise ValueError(
            f"sensitivity must be >= 1 for an integer statistic (a change of one is the least), got {sensitivity:g}"
        )
    if integer and sensitivity != math.floor(sensitivity):
        raise ValueError(
            f"sensitivity must be an integer here (an integer statistic changes by whole steps), got {sensitivity:g}"
        )
    return sensitivity


#: The least noise scale of the discrete Laplace (float64 throughout): float64's smallest normal number.
_MIN_SCALE = torch.finfo(torch.float64).tiny
#: The least discrete Gaussian sigma: its pmf divides by ``2 sigma^2``, which must be a normal float64.
_MIN_SIGMA = math.sqrt(torch.finfo(torch.float64).tiny)


def _check_sigma(sigma: float, source: str) -> float:
    return check_scale(
        "sigma",
        sigma,
        source,
        MAX_SIGMA,
        "the noise table would cover |k| <= 10 sigma + 2",
        _MIN_SIGMA,
        "sigma^2 is subnormal or 0 in float64, so its pmf would divide by 0",
    )


def _check_scale(scale: float, source: str = "") -> float:
    """The discrete Laplace's ``check_scale``, down to float64's smallest normal number (it computes in float64)."""
    return check_scale(
        "scale",
        scale,
        source,
        least=_MIN_SCALE,
        why_least="it is subnormal or 0 in float64, where it computes",
    )


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    return delta


class IntegerInput:
    """For mechanisms that add integer noise: the statistics they take must be integers, held exactly (float32
    holds them only up to 2^24, so statistics and releases are float64, exact to 2^53)."""

    @property
    def dtype(self) -> torch.dtype:
        return torch.float64

    def check_input(self, s: Tensor) -> None:
        check_exact_integers("s", s)
        if s.is_floating_point() and bool((s != torch.round(s)).any()):
            bad = s[s != torch.round(s)][0].item()
            raise ValueError(
                f"{type(self).__name__} adds integer noise to integer statistics; s holds non-integer values, "
                f"e.g. {bad}"
            )


def _integer_valued(x: Tensor) -> Tensor:
    return torch.isfinite(x) & (x == torch.round(x))


# ---- discrete Gaussian: normalizer, tails, (epsilon, delta) ----------------------------------------------------


def discrete_gaussian_log_normalizer(sigma: float) -> float:
    """``log Z``, ``Z = sum_k e^{-k^2 / (2 sigma^2)}``: summed directly for ``sigma < 1``, else by Poisson summation
    ``Z = sigma sqrt(2 pi) (1 + 2 sum_{n >= 1} e^{-2 pi^2 sigma^2 n^2})`` (both exact to float precision)."""
    sigma = check_positive("sigma", sigma)
    if sigma < 1:
        k = np.arange(-(math.ceil(10 * sigma) + 2), math.ceil(10 * sigma) + 3, dtype=np.float64)
        return float(logsumexp(-(k**2) / (2 * sigma**2)))
    n = np.arange(1, 4, dtype=np.float64)
    return math.log(sigma * math.sqrt(2 * math.pi)) + math.log1p(
        2 * float(np.exp(-2 * math.pi**2 * sigma**2 * n**2).sum())
    )


def discrete_gaussian_log_tail(m: int, sigma: float) -> float:
    """``log P(Y >= m)`` for an integer ``m`` and ``Y ~ N_Z(0, sigma^2)``, summed term by term (relative error
    below e^-50)."""
    m = int(m)
    if m <= 0:  # P(Y >= m) = 1 - P(Y <= m - 1) = 1 - P(Y >= 1 - m)
        return math.log1p(-math.exp(discrete_gaussian_log_tail(1 - m, sigma)))
    terms = math.ceil(min(10 * sigma, 50 * sigma**2 / m)) + 2
    k = m + np.arange(terms, dtype=np.float64)
    return float(logsumexp(-(k**2) / (2 * sigma**2))) - discrete_gaussian_log_normalizer(sigma)


def discrete_gaussian_delta(epsilon: float, sigma: float, sensitivity: int) -> float:
    """Exact ``delta(epsilon)`` of ``q + N_Z(0, sigma^2)`` for an integer-valued scalar ``q`` of sensitivity
    ``Delta`` (CKS Thm. 7): ``P(Y > eps sigma^2 / Delta - Delta / 2) - e^eps P(Y > eps sigma^2 / Delta + Delta / 2)``."""
    a = epsilon * sigma**2 / sensitivity - sensitivity / 2
    upper = discrete_gaussian_log_tail(math.floor(a) + 1, sigma)  # P(Y > x) = P(Y >= floor(x) + 1)
    # the second sum starts Delta terms after the first: floor(a + Delta) can round to one more where a is an ulp
    # below an integer
    lower = discrete_gaussian_log_tail(math.floor(a) + 1 + sensitivity, sigma)
    return max(0.0, math.exp(upper) - math.exp(epsilon + lower))


def _decreasing_root(f, start: float) -> float:
    """Root in ``log x`` of a decreasing ``f`` bracketed by doubling / halving from ``start``."""
    lo = hi = math.log(start)
    while f(math.exp(lo)) < 0:
        lo -= math.log(2)
    while f(math.exp(hi)) > 0:
        hi += math.log(2)
    return math.exp(brentq(lambda x: f(math.exp(x)), lo, hi, xtol=1e-13, rtol=1e-14))


def discrete_gaussian_epsilon(delta: float, sigma: float, sensitivity: int) -> float:
    """The smallest ``epsilon`` with ``discrete_gaussian_delta(epsilon) <= delta`` (scalar statistic)."""
    if discrete_gaussian_delta(0.0, sigma, sensitivity) <= delta:
        raise ValueError(
            f"a discrete Gaussian with sigma={sigma:g} and sensitivity {sensitivity:g} is already (0, {delta:g})-DP; "
            "choose a smaller delta"
        )
    upper = 1.0
    while discrete_gaussian_delta(upper, sigma, sensitivity) > delta:
        upper *= 2
    return brentq(
        lambda e: discrete_gaussian_delta(e, sigma, sensitivity) - delta, 0.0, upper, xtol=1e-14, rtol=1e-14
    )


def discrete_gaussian_sigma(epsilon: float, delta: float, sensitivity: int) -> float:
    """The smallest ``sigma`` whose discrete Gaussian is exactly ``(epsilon, delta)``-DP on a scalar integer
    statistic of sensitivity ``Delta`` (CKS Thm. 7 solved by bisection in ``log sigma``)."""
    start = analytic_sigma(epsilon, delta, sensitivity)  # the continuous Gaussian's: close
    sigma = _decreasing_root(lambda s: discrete_gaussian_delta(epsilon, s, sensitivity) - delta, start)
    while (
        discrete_gaussian_delta(epsilon, sigma, sensitivity) > delta
    ):  # land on the private side of the root
        sigma *= 1 + 1e-12
    return sigma


def zcdp_epsilon(rho: float, delta: float) -> float:
    """``epsilon`` at ``delta`` of a ``rho``-zCDP mechanism by CKS Cor. 13 (Prop. 12 applied to the Renyi
    divergences ``alpha rho``): ``inf_{alpha > 1} alpha rho + log(1 - 1/alpha) - (log delta + log alpha) / (alpha - 1)``."""
    rho, delta = check_positive("rho", rho), _check_delta(delta)

    def eps(x: float) -> float:  # x = log(alpha - 1)
        alpha = 1 + math.exp(x)
        return alpha * rho + math.log1p(-1 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1)

    guess = math.log(
        math.sqrt(math.log(1 / delta) / rho)
    )  # the optimum is near alpha - 1 = sqrt(log(1/delta) / rho)
    best = minimize_scalar(eps, bounds=(guess - 8, guess + 8), method="bounded", options={"xatol": 1e-12})
    return max(0.0, float(best.fun))


def zcdp_rho(epsilon: float, delta: float) -> float:
    """The largest ``rho`` whose zCDP guarantee converts to ``(epsilon, delta)`` by :func:`zcdp_epsilon`."""
    epsilon, delta = check_positive("epsilon", epsilon), _check_delta(delta)
    rho = _decreasing_root(lambda r: epsilon - zcdp_epsilon(r, delta), epsilon**2 / (4 * math.log(1 / delta)))
    while zcdp_epsilon(rho, delta) > epsilon:
        rho *= 1 - 1e-12
    return rho


# ---- the same on tensors: one sigma per entry, on the device, without reading values on the host ----------------

#: Terms of a discrete Gaussian tail summed one by one before its Euler-Maclaurin remainder (:func:`_log_tail_sum`).
_TERMS = 16
#: Halvings of a bisection and golden-section steps of the vectorized calibrations (fixed: no host read).
_BISECTIONS, _GOLDEN_STEPS = 64, 48
#: Points of :func:`discrete_gaussian_quantiles`' window, ``low`` to ``low + 9`` (its ``high`` is at most ``low + 9``).
_WINDOW = 10
_GOLDEN = (math.sqrt(5) - 1) / 2
#: The epsilons (``log epsilon``) of the scalar calibration's table of brackets (:func:`discrete_gaussian_sigmas`):
#: steps of 0.0024. Below it a row's bracket runs from the table's first non-private end to ``2 MAX_SIGMA`` (as
#: epsilon falls to 0, sigma rises to ``Delta / (delta sqrt(2 pi))``, 4e5 at delta 1e-6); above it sigma is below
#: 0.01 for a sensitivity up to about 4e4.
_SIGMA_GRID = (-20.0, 30.0, 20481)
#: The scalar calibration's sigmas are private at ``delta (1 - _DELTA_MARGIN)``, so that another order of the same
#: sums (a compiled step's, 1e-12 of delta apart at small epsilon) finds them private at ``delta``.
_DELTA_MARGIN = 1e-9
#: Newton steps of :func:`discrete_gaussian_sigmas` in its table's bracket (fixed: no host read).
_NEWTON_STEPS = 6
#: Where :func:`discrete_gaussian_sigmas` looks for the private side last: :data:`_LANDINGS` offsets above the
#: bracket's non-private end, from 1e-12 in steps of 4, relative to its ``log sigma`` (at least 1); made on the device
#: (no copy from the host, which a CUDA graph's capture refuses).
_LANDING_FIRST, _LANDING_RATIO, _LANDINGS = 1e-12, 4.0, 7
#: The grid of the zCDP conversions' tables of optima (:func:`_at_optimum`): ``log epsilon`` or ``log rho``.
_LOG_GRID = (-20.0, 20.0, 4097)


def _log_normalizer(sigma: Tensor) -> Tensor:
    """:func:`discrete_gaussian_log_normalizer` for every entry of ``sigma`` (float64): the direct sum over
    ``|k| <= 12`` below 1 (it holds ``|k| <= 10 sigma + 2``), Poisson summation from 1."""
    k = torch.arange(-12, 13, dtype=sigma.dtype, device=sigma.device)
    small, large = sigma.clamp(max=1.0), sigma.clamp(min=1.0)
    direct = torch.logsumexp(-(k**2) / (2 * small[..., None] ** 2), -1)
    n = torch.arange(1, 4, dtype=sigma.dtype, device=sigma.device)
    poisson = torch.log(large * math.sqrt(2 * math.pi)) + torch.log1p(
        2 * torch.exp(-2 * math.pi**2 * large[..., None] ** 2 * n**2).sum(-1)
    )
    return torch.where(sigma < 1, direct, poisson)


def _log_tail_sum(m: Tensor, sigma: Tensor) -> Tensor:
    """``log sum_{k >= m} e^{-k^2 / (2 sigma^2)}`` for integers ``m >= 0`` (float64, broadcasting): the first
    :data:`_TERMS` terms summed, the rest from ``m + _TERMS`` by :func:`_log_tail_rest`."""
    k = m[..., None] + torch.arange(_TERMS, dtype=m.dtype, device=m.device)
    head = torch.logsumexp(-(k**2) / (2 * sigma[..., None] ** 2), -1)
    return torch.logaddexp(head, _log_tail_rest(m + _TERMS, sigma))


def _log_tail_rest(start: Tensor, sigma: Tensor) -> Tensor:
    """``log sum_{k >= M} e^{-k^2 / (2 sigma^2)}`` for ``M = start`` at least :data:`_TERMS` terms past the tail's
    first (float64, broadcasting), by Euler-Maclaurin: ``f(M) [sigma sqrt(pi/2) erfcx(t / sqrt 2) + 1/2 + He_1(t)
    / (12 sigma) - He_3(t) / (720 sigma^3) + He_5(t) / (30240 sigma^5)]`` with ``t = M / sigma``, where ``M <= 3
    sigma^2`` (its relative error, about ``2 (M / (2 pi sigma^2))^8``, weighs on a rest that is at most ``e^{-16
    M / sigma^2}`` of the tail: below 1e-12 together); beyond, the terms fall by more than ``e^-3`` a step and
    the rest, below ``e^-48`` of the first terms, is left out (``-inf``)."""
    t = start / sigma
    he1, he3, he5 = t, t**3 - 3 * t, t**5 - 10 * t**3 + 15 * t
    rest = (
        sigma * math.sqrt(math.pi / 2) * torch.special.erfcx(t / math.sqrt(2))
        + 0.5
        + he1 / (12 * sigma)
        - he3 / (720 * sigma**3)
        + he5 / (30240 * sigma**5)
    )
    near = start <= 3 * sigma**2
    return torch.where(near, -(t**2) / 2 + torch.log(torch.where(near, rest, 1.0)), -math.inf)


def _log_sf(m: Tensor, sigma: Tensor, log_z: Tensor) -> Tensor:
    """``log P(Y >= m)`` for integers ``m`` and ``Y ~ N_Z(0, sigma^2)`` (float64): the tail for ``m >= 1``, and
    ``1 - P(Y >= 1 - m)`` below."""
    upper = m >= 1
    log_tail = _log_tail_sum(torch.where(upper, m, 1 - m), sigma) - log_z
    return torch.where(upper, log_tail, torch.log1p(-torch.exp(log_tail)))


def _deltas(epsilon: Tensor, sigma: Tensor, sensitivity: int) -> Tensor:
    """:func:`discrete_gaussian_delta` for every entry (float64 tensors, broadcasting)."""
    a = epsilon * sigma**2 / sensitivity - sensitivity / 2
    log_z = _log_normalizer(sigma)
    upper = _log_sf(torch.floor(a) + 1, sigma, log_z)
    lower = _log_sf(torch.floor(a) + 1 + sensitivity, sigma, log_z)  # as discrete_gaussian_delta's
    return (torch.exp(upper) - torch.exp(epsilon + lower)).clamp(min=0.0)


def _bisection(private, low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
    """``[low, high]`` (logs) after :data:`_BISECTIONS` halvings in log: ``private(x)`` (a boolean tensor) must be
    false at ``exp(low)`` and true at ``exp(high)``, and is so at the ends returned."""
    for _ in range(_BISECTIONS):
        mid = (low + high) / 2
        ok = private(torch.exp(mid))
        low, high = torch.where(ok, low, mid), torch.where(ok, mid, high)
    return low, high


def _bisect_log(private, low: Tensor, high: Tensor) -> Tensor:
    """The end of ``[exp(low), exp(high)]`` on the private side after :func:`_bisection`."""
    return torch.exp(_bisection(private, low, high)[1])


def _golden_argmax(f, low: Tensor, high: Tensor) -> Tensor:
    """The point of ``max f`` over ``[low, high]`` for a unimodal ``f`` (per entry): :data:`_GOLDEN_STEPS`
    golden-section steps; the better of the last bracket's two points."""
    a, b = low + (1 - _GOLDEN) * (high - low), low + _GOLDEN * (high - low)
    fa, fb = f(a), f(b)
    for _ in range(_GOLDEN_STEPS):
        left = fa >= fb  # the maximum lies in [low, b]
        low, high = torch.where(left, low, a), torch.where(left, b, high)
        point = torch.where(left, low + (1 - _GOLDEN) * (high - low), low + _GOLDEN * (high - low))
        value = f(point)  # the one new point: a's successor on the left, b's on the right
        a, b = torch.where(left, point, b), torch.where(left, a, point)
        fa, fb = torch.where(left, value, fb), torch.where(left, fa, value)
    return torch.where(fa >= fb, a, b)


def _at_optimum(kind: str, objective, guess, width: float, value: Tensor, delta: float) -> Tensor:
    """``objective(value, delta)`` (a function of ``x = log(alpha - 1)``, per entry) at its maximum over ``guess(value,
    delta) +- width``: the golden section's optimum, tabled as an offset from the guess over ``log value``
    (:data:`_LOG_GRID`, once per ``delta``; :func:`~dpsbi.mechanisms.tables.tabled`) and interpolated. Every ``alpha``
    gives a valid conversion, so the interpolation costs only optimality, to second order (about 1e-12 of the
    value); outside the grid the offset at its nearer end."""

    def offsets(t: Tensor) -> Tensor:
        at = torch.exp(t)
        start = guess(at, delta)
        return _golden_argmax(objective(at, delta), start - width, start + width) - start

    x = guess(value, delta) + tabled(kind, delta, _LOG_GRID, offsets, torch.log(value))
    return objective(value, delta)(x)


def _bisected_sigmas(epsilon: Tensor, delta: float, sensitivity: int) -> Tensor:
    """CKS Thm. 7 bisected in ``log sigma`` on ``[0.01, 2 MAX_SIGMA]`` by :data:`_BISECTIONS` halvings, per entry of
    ``epsilon (n,)``: the ends ``(n, 2)``, ``log sigma`` not private and private (at most an ulp or two apart)."""
    low = torch.full_like(epsilon, math.log(0.01))
    high = torch.full_like(epsilon, math.log(2 * MAX_SIGMA))
    return torch.stack(_bisection(lambda sigma: _deltas(epsilon, sigma, sensitivity) <= delta, low, high), -1)


def discrete_gaussian_sigmas(epsilon: Tensor, delta: float, sensitivity: int) -> Tensor:
    """Vectorized :func:`discrete_gaussian_sigma` (float64, per entry of ``epsilon``) in a fixed number of steps:

    - **a bracket from a table**: CKS Thm. 7 bisected once per ``delta`` and sensitivity at the epsilons of
      :data:`_SIGMA_GRID` (:func:`_bisected_sigmas`); ``delta(epsilon)`` falls with ``epsilon``, so the sigma not
      private at the grid's next epsilon and the private one at the grid's epsilon below bracket the row's;
    - **:data:`_NEWTON_STEPS` safeguarded Newton steps** on ``log delta(log sigma)`` from the table's interpolation
      (:func:`_newton`), each one call of the exact ``delta`` at four points a row;
    - **landing on the private side**: the smallest private point among the last step's, a few just above the
      bracket's non-private end (:data:`_LANDINGS`) and its private end.

    All of it at ``delta (1 - _DELTA_MARGIN)`` (:data:`_DELTA_MARGIN`). Every answer is private (the private end of a
    bracket at worst) where some sigma up to ``2 MAX_SIGMA`` is; elsewhere, and for a NaN or negative epsilon, it is
    ``2 MAX_SIGMA``, as the bisection gave (past ``MAX_SIGMA``, which the mechanism refuses); from epsilon 1e-5 to
    :func:`one_to_one_epsilon` (100 000 epsilons at each of four deltas and sensitivities) within 4.5e-10 of a
    64-halving bisection, whose own rounding floor that is, in 7 calls of ``delta`` where the bisection makes 64
    (``tests/test_discrete_mechanisms.py``). ``sensitivity`` is a Python int (a table's key)."""
    eps, delta = epsilon.double(), delta * (1 - _DELTA_MARGIN)
    ends = table(
        f"discrete_gaussian_sigma/{sensitivity}",
        delta,
        _SIGMA_GRID,
        lambda grid: _bisected_sigmas(torch.exp(grid), delta, sensitivity),
        eps.device,
    )
    log_eps = torch.where(eps > 0, torch.log(eps), -math.inf)  # NaN and negatives below the grid too
    index, weight = cell(_SIGMA_GRID, log_eps)
    below = log_eps < _SIGMA_GRID[0]
    hi = torch.where(below, math.log(2 * MAX_SIGMA), ends[index, 1])
    lo = torch.minimum(ends[index + 1, 0], hi)
    start = (ends[index, 1] * (1 - weight) + ends[index + 1, 1] * weight).clamp(lo, hi)
    excess = _log_excess(eps, delta, sensitivity)
    x, lo, hi = _newton(excess, start, lo, hi, lambda x: _kinks(x, eps, sensitivity))
    scale = lo.abs().clamp(min=1.0)[..., None]
    landing = _LANDING_FIRST * _LANDING_RATIO ** torch.arange(_LANDINGS, dtype=lo.dtype, device=lo.device)
    candidates = torch.cat([x[..., None], lo[..., None] + landing * scale, hi[..., None]], -1)
    private = torch.where(excess(candidates) <= 0, candidates, math.inf).amin(-1)
    return torch.exp(torch.where(torch.isfinite(private), private, hi))


def _log_excess(epsilon: Tensor, delta: float, sensitivity: int):
    """``x (n, k) -> log delta(epsilon, e^x) - log delta (n, k)`` for ``epsilon (n,)`` (CKS Thm. 7; at most 0
    where ``e^x`` is private)."""

    def excess(x: Tensor) -> Tensor:
        return torch.log(_deltas(epsilon[..., None], torch.exp(x), sensitivity)) - math.log(delta)

    return excess


def _kinks(x: Tensor, epsilon: Tensor, sensitivity: int) -> Tensor:
    """The ``log sigma (n, 2)`` nearest ``x (n,)`` below and above where ``epsilon sigma^2 / Delta - Delta / 2`` is
    an integer: there the sums of CKS Thm. 7 gain or lose a term, and ``delta``'s slope jumps."""
    a = epsilon * torch.exp(2 * x) / sensitivity - sensitivity / 2
    k = torch.floor(a)[..., None] + torch.arange(2, dtype=x.dtype, device=x.device)
    return 0.5 * torch.log((k + sensitivity / 2).clamp(min=1e-300) * sensitivity / epsilon[..., None])


def _newton(excess, x: Tensor, lo: Tensor, hi: Tensor, kinks) -> tuple[Tensor, Tensor, Tensor]:
    """:data:`_NEWTON_STEPS` Newton steps towards the root of a decreasing ``excess`` from ``x``, inside ``[lo,
    hi]`` (``excess`` above 0 at ``lo``, at most 0 at ``hi``), all ``(n,)``: each evaluates ``x``, ``x + h`` (the
    slope; ``h`` a thousandth of the bracket, 1e-13 to 1e-7 of ``x``) and ``kinks(x) (n, 2)`` in one call, narrows
    the bracket by every point's sign, and steps to Newton's point if it lies inside, else to regula falsi's on
    the bracket, else to its middle. Returns the next point (not evaluated) and the bracket."""
    # the ends' values, not known at first: regula falsi on them gives NaN, never a step
    g_lo, g_hi = torch.full_like(lo, math.inf), torch.full_like(hi, -math.inf)
    for _ in range(_NEWTON_STEPS):
        size = x.abs().clamp(min=1.0)
        h = torch.minimum(1e-3 * (hi - lo), 1e-7 * size).clamp(min=1e-13 * size)
        points = torch.cat([torch.stack([x, x + h], -1), kinks(x).clamp(lo[..., None], hi[..., None])], -1)
        values = excess(points)
        for point, value in zip(points.unbind(-1), values.unbind(-1), strict=True):
            inside = (point > lo) & (point < hi)  # the ends' own signs are known
            above, below = inside & (value > 0), inside & (value <= 0)
            lo, g_lo = torch.where(above, point, lo), torch.where(above, value, g_lo)
            hi, g_hi = torch.where(below, point, hi), torch.where(below, value, g_hi)
        step = x - values[..., 0] * h / (values[..., 1] - values[..., 0])
        falsi = hi - g_hi * (hi - lo) / (g_hi - g_lo)
        newton, regula = (step > lo) & (step < hi), (falsi > lo) & (falsi < hi)  # NaN and infinities: neither
        x = torch.where(newton, step, torch.where(regula, falsi, (lo + hi) / 2))
    return x, lo, hi


def discrete_gaussian_epsilons(delta: float, sigma: Tensor, sensitivity: int) -> Tensor:
    """Vectorized :func:`discrete_gaussian_epsilon` (float64, per entry of ``sigma``): bisected in ``log epsilon``
    below the zCDP conversion's epsilon (an upper bound), ending on the private side."""
    sigma = sigma.double()
    high = torch.log(zcdp_epsilons(sensitivity**2 / (2 * sigma**2), delta)) + 1e-9
    return _bisect_log(lambda eps: _deltas(eps, sigma, sensitivity) <= delta, high - 40, high)


@functools.cache
def one_to_one_epsilon(delta: float, sensitivity: int) -> float:
    """The largest epsilon below which CKS Thm. 7 gives each epsilon one sigma (``inf`` where it always does):
    below a few sensitivities of noise, ``delta(epsilon, sigma)`` rises and falls with ``sigma`` as the integers
    cross the privacy loss's threshold, so smaller sigmas than the calibrated one can be private at the same
    epsilon (at ``delta = 1e-6``, sensitivity 1: ``sigma = 1`` is private at epsilon 4.50, which calibrates back
    to sigma 1.09). That starts at the lowest local minimum of a sigma's epsilon: found on a grid of 32 001 sigmas
    from 0.01 to 30 sensitivities, where the epsilon rises, then, for the rises within 0.2 % of the lowest, at the
    minimum itself, a kink of CKS Thm. 7 (:func:`_kink_epsilons`), which the grid steps over (by 6e-5 at delta
    1e-10, sensitivity 3). A few seconds, once per ``delta`` and sensitivity."""
    sigma = torch.exp(torch.linspace(math.log(0.01), math.log(30 * sensitivity), 32001, dtype=torch.float64))
    epsilon = discrete_gaussian_epsilons(delta, sigma, sensitivity)
    rising = torch.nonzero(epsilon[1:] > epsilon[:-1] * (1 + 1e-9))[:, 0]
    if rising.numel() == 0:
        return math.inf
    lowest = epsilon[rising].min()
    # a grid step moves epsilon by at most twice its step in log sigma: below 1e-3 for any sensitivity up to 1e4
    start = rising[epsilon[rising] <= lowest * 1.002].clamp(min=1)
    kinks = _kink_epsilons(delta, sensitivity, sigma[start - 1], sigma[start + 1])
    return min(float(lowest), float(kinks.min()))


def _kink_epsilons(delta: float, sensitivity: int, low: Tensor, high: Tensor) -> Tensor:
    """The epsilons ``(n, 3)`` of the sigmas in ``[low, high] (n,)`` where the curve of a sigma's epsilon meets a
    kink of CKS Thm. 7 (``a = epsilon sigma^2 / Delta - Delta / 2`` an integer ``m``; ``a`` rises with ``sigma`` along
    the curve, whose epsilon falls more slowly than ``1 / sigma^2``): the first three integers past ``a(low)``, each
    bisected 48 times in ``sigma``; ``inf`` where ``a(high)`` stays below it."""

    def a(s: Tensor) -> Tensor:
        return discrete_gaussian_epsilons(delta, s, sensitivity) * s**2 / sensitivity - sensitivity / 2

    m = torch.floor(a(low))[:, None] + torch.arange(1.0, 4.0, dtype=low.dtype)
    lo, hi = low[:, None].expand_as(m), high[:, None].expand_as(m)
    for _ in range(48):
        mid = (lo + hi) / 2
        past = a(mid) >= m
        lo, hi = torch.where(past, lo, mid), torch.where(past, mid, hi)
    return torch.where(a(high)[:, None] >= m, discrete_gaussian_epsilons(delta, hi, sensitivity), math.inf)


def _alpha(x: Tensor) -> Tensor:
    return 1 + torch.exp(x)


def zcdp_epsilons(rho: Tensor, delta: float) -> Tensor:
    """Vectorized :func:`zcdp_epsilon` (float64): the infimum over ``alpha`` in ``log(alpha - 1)`` on the scalar
    version's bracket (:func:`_at_optimum`)."""
    return (-_at_optimum("zcdp_epsilon", _minus_epsilon, _epsilon_guess, 8.0, rho.double(), delta)).clamp(
        min=0.0
    )


def _minus_epsilon(rho: Tensor, delta: float):
    """``x = log(alpha - 1) -> -epsilon``, the conversion of ``rho``-zCDP at ``alpha`` (CKS Cor. 13)."""

    def minus_eps(x: Tensor) -> Tensor:
        alpha = _alpha(x)
        return -(alpha * rho + torch.log1p(-1 / alpha) - (math.log(delta) + torch.log(alpha)) / (alpha - 1))

    return minus_eps


def _epsilon_guess(rho: Tensor, delta: float) -> Tensor:
    """The optimum's ``log(alpha - 1)`` is near ``0.5 log(log(1/delta) / rho)``."""
    return 0.5 * torch.log(-math.log(delta) / rho)


def zcdp_rhos(epsilon: Tensor, delta: float) -> Tensor:
    """Vectorized :func:`zcdp_rho` (float64): ``epsilon(rho) <= epsilon`` means ``rho <= g(alpha) = (epsilon -
    log(1 - 1/alpha) + (log delta + log alpha) / (alpha - 1)) / alpha`` for some ``alpha > 1``, so the largest
    ``rho`` is ``max_alpha g``, in ``log(alpha - 1)`` (:func:`_at_optimum`; any ``alpha`` gives a private ``rho``)."""
    return _at_optimum("zcdp_rho", _rho_bound, _rho_guess, 12.0, epsilon.double(), delta)


def _rho_bound(eps: Tensor, delta: float):
    """``x = log(alpha - 1) -> g(alpha)``, the ``rho`` whose conversion at ``alpha`` is ``eps``."""

    def g(x: Tensor) -> Tensor:
        alpha = _alpha(x)
        return (eps - torch.log1p(-1 / alpha) + (math.log(delta) + torch.log(alpha)) / (alpha - 1)) / alpha

    return g


def _rho_guess(eps: Tensor, delta: float) -> Tensor:
    """``alpha - 1 = sqrt(log(1/delta) / rho)`` with ``rho ~ eps^2 / (4 log(1/delta))``."""
    return torch.log(-2 * math.log(delta) / eps)


def discrete_gaussian_quantiles(w: Tensor, sigma: Tensor) -> Tensor:
    """The largest ``m >= 0`` with ``P(Y >= m) >= w``, ``Y ~ N_Z(0, sigma^2)``, capped at ``10 sigma + 2`` as the
    scalar noise table is (float64 integers; ``w`` in (0, 1/2], ``sigma`` broadcasting), searched in a window of
    the continuous Gaussian's quantile ``1/2 - sigma ndtri(w)``, ``low = guess - 4`` (at least 0) to ``high =
    guess + 5``, which holds it: ``P(Y >= low) >= w > P(Y >= high)``. The tails at ``low + 9 .. low`` are one
    cumulative sum of the ``_WINDOW + _TERMS`` terms from ``low + 25`` down to ``low`` (smallest first: no
    cancellation) plus the Euler-Maclaurin rest beyond (:func:`_log_tail_rest`); the answer is the count of window
    points whose tail is at least ``w``, less one (clamped to the window)."""
    w, sigma = w.double(), sigma.double()
    guess = torch.floor(0.5 - sigma * torch.special.ndtri(w))
    low, high = (guess - 4).clamp(min=0.0), guess + 5
    size = _WINDOW + _TERMS
    k = low[..., None] + torch.arange(size - 1, -1, -1, dtype=low.dtype, device=low.device)  # descending
    log_terms = k.square_().mul_(-0.5 / sigma[..., None].square())
    rest = _log_tail_rest(low + size, sigma)
    shift = torch.maximum(log_terms[..., -1], rest)[..., None]  # the largest term is the last, at k = low
    terms = log_terms.sub_(shift).exp_()
    tails = terms.cumsum(-1)[..., -_WINDOW:] + torch.exp(rest[..., None] - shift)  # at low + 9 .. low
    bound = (_log_normalizer(sigma) + torch.log(w))[..., None] - shift  # log P(Y >= k) >= log w, shifted
    count = (torch.log(tails) >= bound).sum(-1)
    m = torch.minimum(torch.maximum(low + count - 1, low), high - 1)
    return torch.minimum(m, torch.ceil(10 * sigma) + 2)


# ---- the mechanisms ---------------------------------------------------------------------------------------------


class DiscreteLaplace(IntegerInput, AdditiveNoise, Mechanism):
    """``y = s + n`` on integer statistics, ``n_i`` i.i.d. discrete Laplace (two-sided geometric) with
    ``P(n_i = k) = (1 - p) / (1 + p) p^|k|``, ``p = e^{-1/t}``, scale ``t = sensitivity / epsilon``.

    ``sensitivity`` is the L1 sensitivity of the integer statistic (>= 1); the release is ``epsilon``-DP (pure).
    :meth:`from_scale` builds it from the scale ``t`` (OpenDP's ``scale``). Releases are integers (``lattice = 1``).
    """

    lattice = 1.0
    clamp_lossless = True

    def __init__(self, epsilon: float, sensitivity: float, dim: int = 1) -> None:
        super().__init__(dim, epsilon)
        self.sensitivity = _check_sensitivity(sensitivity, integer=True)
        self._set_scale(
            _check_scale(
                self.sensitivity / self.epsilon, f"epsilon={self.epsilon:g}, sensitivity={self.sensitivity:g}"
            )
        )

    def _set_scale(self, scale: float) -> None:
        self.scale = scale
        self.p = math.exp(-1 / scale)
        self._log_p0 = math.log(-math.expm1(-1 / scale)) - math.log1p(self.p)  # log((1 - p) / (1 + p))

    @classmethod
    def from_scale(cls, scale: float, sensitivity: float, dim: int = 1) -> DiscreteLaplace:
        """The mechanism with scale ``t = scale`` exactly; its ``epsilon`` is ``sensitivity / scale``."""
        scale = _check_scale(check_positive("scale", scale))
        mech = cls(_check_sensitivity(sensitivity, integer=True) / scale, sensitivity, dim)
        mech._set_scale(scale)
        return mech

    #: :meth:`with_epsilon` also takes a tensor of epsilons (see :mod:`dpsbi.mechanisms.epsilon`).
    batched_epsilon = True

    def with_epsilon(self, epsilon: float | Tensor) -> DiscreteLaplace:
        """The same mechanism (sensitivity, dim) calibrated at another ``epsilon``. A tensor of epsilons
        broadcasting with the summaries gives one mechanism drawing each row at its own epsilon (its ``scale``
        and ``p`` tensors; :mod:`dpsbi.mechanisms.epsilon`)."""
        if not torch.is_tensor(epsilon):
            return type(self)(epsilon, self.sensitivity, self.dim)
        epsilon = epsilons(epsilon)
        scale = self.sensitivity / epsilon
        return batched_copy(self, epsilon, scale=scale, p=torch.exp(-1 / scale))

    def transform(self, s: Tensor, u: Tensor) -> Tensor:
        # Smallest k with F(k) >= u, by symmetry from the lower tail F(-m) = p^m / (1 + p), m >= 1.
        lower = u <= 0.5
        w = torch.where(lower, u, 1 - u)
        # p is a tensor for a mechanism at a tensor of epsilons (with_epsilon)
        log1p_p = torch.log1p(self.p) if torch.is_tensor(self.p) else math.log1p(self.p)
        r = -self.scale * (torch.log(w) + log1p_p)  # F(-m) >= w  <=>  m <= r
        k = torch.where(lower, -torch.floor(r), torch.ceil(r) - 1)
        return s + k

    def noise_log_prob(self, x: Tensor) -> Tensor:
        return torch.where(_integer_valued(x), self._log_p0 - x.abs() / self.scale, -math.inf)

    def noise_log_cdf(self, x: Tensor) -> Tensor:
        k = torch.floor(x)
        below = k.clamp(max=-1) / self.scale - math.log1p(self.p)  # k < 0: p^|k| / (1 + p)
        above = torch.log1p(-torch.exp(-(k.clamp(min=0) + 1) / self.scale - math.log1p(self.p)))
        return torch.where(k < 0, below, above)

    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        self._check_shapes(y, s)
        return self.coordinate_log_prob(y, s).sum(-1)

    def max_log_prob(self, y: Tensor) -> Tensor:
        return torch.full(y.shape[:-1], self.dim * self._log_p0, dtype=y.dtype, device=y.device)

    def in_support(self, y: Tensor) -> Tensor:
        return _integer_valued(y).all(-1)

    def __repr__(self) -> str:
        return (
            f"DiscreteLaplace(dim={self.dim}, epsilon={show(self.epsilon)}, sensitivity={show(self.sensitivity)}, "
            f"scale={show(self.scale)})"
        )


class DiscreteGaussian(IntegerInput, AdditiveNoise, Mechanism):
    """``y = s + n`` on integer statistics, ``n_i`` i.i.d. discrete Gaussian ``P(n_i = k) ∝ e^{-k^2 / (2 sigma^2)}``.

    Give exactly one calibration: ``epsilon`` with ``delta`` (the smallest ``sigma`` that is exactly
    ``(epsilon, delta)``-DP: CKS Thm. 7 for ``dim = 1``; for ``dim > 1`` the largest ``rho`` whose zCDP guarantee
    converts to ``(epsilon, delta)``, CKS Cor. 13), ``rho`` (zCDP, ``sigma = sensitivity / sqrt(2 rho)``) or
    ``sigma``; also :meth:`from_rho`, :meth:`from_sigma`. ``sensitivity`` is the L2 sensitivity (>= 1; an integer
    for ``dim = 1``).

    It is a zCDP mechanism: :attr:`rho` ``= sensitivity^2 / (2 sigma^2)`` is its guarantee, and :attr:`epsilon`
    is its ``epsilon`` at :attr:`delta` (given, or by default ``delta = 1e-6`` when built from ``rho`` or
    ``sigma``), computed as above. Releases are integers (``lattice = 1``).
    """

    lattice = 1.0

    def __init__(
        self,
        epsilon: float | None = None,
        delta: float | None = None,
        sensitivity: float = 1.0,
        dim: int = 1,
        *,
        rho: float | None = None,
        sigma: float | None = None,
    ) -> None:
        given = [name for name, v in (("epsilon", epsilon), ("rho", rho), ("sigma", sigma)) if v is not None]
        if len(given) != 1:
            raise ValueError(
                f"DiscreteGaussian takes exactly one of epsilon (with delta), rho and sigma, got {given or 'none'}"
            )
        dim = check_integer("dim", dim)
        self.sensitivity = _check_sensitivity(sensitivity, integer=dim == 1)
        if epsilon is not None:
            if delta is None:
                raise ValueError("DiscreteGaussian(epsilon=...) needs delta (0 < delta < 1)")
            epsilon, delta = check_positive("epsilon", epsilon), _check_delta(delta)
            if int(dim) == 1:
                sigma = discrete_gaussian_sigma(epsilon, delta, int(self.sensitivity))
            else:
                sigma = self.sensitivity / math.sqrt(2 * zcdp_rho(epsilon, delta))
            self.sigma, self.rho = sigma, self.sensitivity**2 / (2 * sigma**2)
            _check_sigma(sigma, f"epsilon={epsilon:g}, delta={delta:g}")
        else:
            delta = _check_delta(1e-6 if delta is None else delta)
            if rho is not None:
                self.rho = check_positive("rho", rho)
                self.sigma = self.sensitivity / math.sqrt(2 * self.rho)
                _check_sigma(self.sigma, f"rho={self.rho:g}, sensitivity={self.sensitivity:g}")
            else:
                self.sigma = _check_sigma(check_positive("sigma", sigma), "")
                self.rho = self.sensitivity**2 / (2 * self.sigma**2)
            if dim == 1:
                epsilon = discrete_gaussian_epsilon(delta, self.sigma, int(self.sensitivity))
            else:
                epsilon = zcdp_epsilon(self.rho, delta)
                if epsilon <= 0:
                    raise ValueError(
                        f"a {self.rho:g}-zCDP mechanism is already (0, {delta:g})-DP; choose a smaller delta"
                    )
        super().__init__(dim, epsilon, delta)
        self.log_normalizer = discrete_gaussian_log_normalizer(self.sigma)
        self.half_width = math.ceil(10 * self.sigma) + 2  # the noise table covers |k| <= half_width
        k = torch.arange(-self.half_width, self.half_width + 1, dtype=torch.float64)
        log_cdf = torch.logcumsumexp(-(k**2) / (2 * self.sigma**2) - self.log_normalizer, 0)
        # Above the median from the lower tail by symmetry, F(k) = 1 - F(-k - 1): accurate and never above 1.
        below = torch.cat(
            [log_cdf[: self.half_width].flip(0), torch.tensor([-math.inf], dtype=torch.float64)]
        )
        self._log_cdf64 = torch.cat([log_cdf[: self.half_width], torch.log1p(-torch.exp(below))])
        self._tables: dict[tuple, tuple[Tensor, Tensor]] = {}

    @classmethod
    def from_rho(
        cls, rho: float, sensitivity: float = 1.0, dim: int = 1, delta: float = 1e-6
    ) -> DiscreteGaussian:
        """The ``rho``-zCDP discrete Gaussian; ``epsilon`` is its value at ``delta``."""
        return cls(sensitivity=sensitivity, dim=dim, delta=delta, rho=rho)

    @classmethod
    def from_sigma(
        cls, sigma: float, sensitivity: float = 1.0, dim: int = 1, delta: float = 1e-6
    ) -> DiscreteGaussian:
        """The discrete Gaussian with parameter ``sigma`` (OpenDP's ``scale``); ``epsilon`` is its value at ``delta``."""
        return cls(sensitivity=sensitivity, dim=dim, delta=delta, sigma=sigma)

    #: :meth:`with_epsilon` (and :meth:`with_rho`, :meth:`with_sigma`) also take a tensor, one value per row.
    batched_epsilon = True

    @property
    def epsilon_limits(self) -> tuple[float, float] | None:
        """The epsilons an amortized fit may train over: for a scalar statistic (``dim = 1``) those below
        :func:`one_to_one_epsilon`, where each epsilon has one sigma (above it a release's sigma and the sigma a
        training step calibrates at its epsilon can differ); ``None`` for a vector (the zCDP conversion is one to
        one)."""
        return (0.0, one_to_one_epsilon(self.delta, int(self.sensitivity))) if self.dim == 1 else None

    def with_epsilon(self, epsilon: float | Tensor) -> DiscreteGaussian:
        """The same mechanism (sensitivity, dim) calibrated to ``(epsilon, self.delta)``. A tensor of epsilons
        broadcasting with the summaries gives one mechanism drawing each row at its own epsilon (its ``sigma``
        and ``rho`` tensors, calibrated on the device as the scalar constructor does: CKS Thm. 7 for ``dim = 1``,
        the zCDP conversion above; :mod:`dpsbi.mechanisms.epsilon`)."""
        if not torch.is_tensor(epsilon):
            return type(self)(epsilon, self.delta, self.sensitivity, self.dim)
        epsilon = epsilons(epsilon)
        if self.dim == 1:
            sigma = discrete_gaussian_sigmas(epsilon, self.delta, int(self.sensitivity))
        else:
            sigma = self.sensitivity / torch.sqrt(2 * zcdp_rhos(epsilon, self.delta))
        return self._batched(epsilon, sigma)

    def with_rho(self, rho: float | Tensor) -> DiscreteGaussian:
        """The ``rho``-zCDP mechanism of the same family (sensitivity, dim, delta); a tensor gives one per row,
        its ``epsilon`` at ``delta`` computed per row as :meth:`from_rho` does."""
        if not torch.is_tensor(rho):
            return type(self).from_rho(rho, self.sensitivity, self.dim, self.delta)
        return self.with_sigma(self.sensitivity / torch.sqrt(2 * epsilons(rho).double()))

    def with_sigma(self, sigma: float | Tensor) -> DiscreteGaussian:
        """The mechanism of the same family with noise parameter ``sigma``; a tensor gives one per row, its
        ``epsilon`` at ``delta`` computed per row as :meth:`from_sigma` does."""
        if not torch.is_tensor(sigma):
            return type(self).from_sigma(sigma, self.sensitivity, self.dim, self.delta)
        sigma = epsilons(sigma).double()
        if self.dim == 1:
            epsilon = discrete_gaussian_epsilons(self.delta, sigma, int(self.sensitivity))
        else:
            epsilon = zcdp_epsilons(self.sensitivity**2 / (2 * sigma**2), self.delta)
        return self._batched(epsilon, sigma)

    def _batched(self, epsilon: Tensor, sigma: Tensor) -> DiscreteGaussian:
        """The copy drawing row ``i`` with ``sigma[i]`` (float64); sigmas above :data:`MAX_SIGMA` are refused
        where they can be read without waiting for the device (:func:`~dpsbi.mechanisms.epsilon.readable`)."""
        sigma = sigma.double()
        if readable(sigma):
            widest = float(sigma.max())
            _check_sigma(widest, f"epsilon={float(epsilon.min()):g}, delta={self.delta:g}")
        return batched_copy(self, epsilon, sigma=sigma, rho=self.sensitivity**2 / (2 * sigma**2))

    def _table(self, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(cdf, log_cdf)`` over ``k = -half_width..half_width`` on ``device`` in ``dtype``, built once."""
        key = (torch.device(device), dtype)
        if key not in self._tables:
            log_cdf = self._log_cdf64.to(device=device, dtype=dtype)
            self._tables[key] = (self._log_cdf64.exp().to(device=device, dtype=dtype), log_cdf)
        return self._tables[key]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tables": {}}  # device tables are rebuilt where they are used

    def transform(self, s: Tensor, u: Tensor) -> Tensor:
        # The smallest k with F(k) >= u; above the median by symmetry, k = -j - 1 with j the largest F(j) <= 1 - u.
        lower = u <= 0.5
        w = torch.where(lower, u, 1 - u).contiguous()
        if torch.is_tensor(self.sigma):  # one sigma per row (with_epsilon of a tensor): searched per entry
            m = discrete_gaussian_quantiles(w, self.sigma.to(u.device))
            return s + torch.where(lower, -m, m).to(u.dtype)
        cdf, _ = self._table(u.device, u.dtype)
        below = torch.searchsorted(cdf, w) - self.half_width
        above = self.half_width - torch.searchsorted(cdf, w, right=True)
        return s + torch.where(lower, below, above).to(u.dtype)

    def noise_log_prob(self, x: Tensor) -> Tensor:
        return torch.where(_integer_valued(x), -(x**2) / (2 * self.sigma**2) - self.log_normalizer, -math.inf)

    def noise_log_cdf(self, x: Tensor) -> Tensor:
        _, table = self._table(x.device, x.dtype)
        k = torch.floor(x)
        index = (k + self.half_width).clamp(0, 2 * self.half_width)
        out = table[index.nan_to_num(0).long()]
        out = torch.where(torch.isnan(x), x, out)
        far = k < -self.half_width  # beyond the table: log P(Y >= m), m = -k, summed term by term
        if bool(far.any()):
            m = -k[far].double()
            least = float(m.min())
            terms = (
                math.ceil(min(10 * self.sigma, 50 * self.sigma**2 / least)) + 2 if math.isfinite(least) else 1
            )
            j = torch.arange(terms, dtype=torch.float64, device=x.device)
            sums = []
            for start in range(0, m.numel(), max(1, _CHUNK // terms)):
                chunk = m[start : start + max(1, _CHUNK // terms), None] + j
                sums.append(torch.logsumexp(-(chunk**2) / (2 * self.sigma**2), -1))
            out = out.masked_scatter(far, (torch.cat(sums) - self.log_normalizer).to(x.dtype))
        return out

    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        self._check_shapes(y, s)
        return self.coordinate_log_prob(y, s).sum(-1)

    def max_log_prob(self, y: Tensor) -> Tensor:
        return torch.full(y.shape[:-1], -self.dim * self.log_normalizer, dtype=y.dtype, device=y.device)

    def in_support(self, y: Tensor) -> Tensor:
        return _integer_valued(y).all(-1)

    def __repr__(self) -> str:
        return (
            f"DiscreteGaussian(dim={self.dim}, epsilon={show(self.epsilon)}, delta={show(self.delta)}, rho={show(self.rho)}, "
            f"sensitivity={show(self.sensitivity)}, sigma={show(self.sigma)})"
        )
