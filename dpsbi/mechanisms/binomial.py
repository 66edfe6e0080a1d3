"""The binomial curve mechanism for epidemic counts (main paper, Prop. 4) and a vectorized binomial quantile."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Mechanism, as_float, check_integer, check_positive, show
from .epsilon import batched_copy, epsilons

#: Tail mass left out of the quantile window, far below float64 resolution.
_TAIL = 1e-18
#: Elements x window entries processed at once by :func:`binomial_icdf`.
_CHUNK = 1 << 23


def log_binomial_coefficients(n: int, device=None, dtype=torch.float64) -> Tensor:
    """``log C(n, k)`` for ``k = 0..n``, shape ``(n + 1,)``."""
    k = torch.arange(n + 1, device=device, dtype=dtype)
    return math.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)


def binomial_log_pmf(k: Tensor, n: int, p: Tensor) -> Tensor:
    """``log P(Bin(n, p) = k)`` elementwise; ``-inf`` where ``k`` is not an integer in ``[0, n]``."""
    k, p = torch.broadcast_tensors(k, p)
    valid = (k >= 0) & (k <= n) & (k == k.round())
    kc = k.clamp(0, n)
    logc = math.lgamma(n + 1) - torch.lgamma(kc + 1) - torch.lgamma(n - kc + 1)
    logp = logc + torch.xlogy(kc, p) + torch.xlogy(n - kc, 1 - p)
    return torch.where(valid, logp, -math.inf)


def _half_width(variance):
    """Half-width of a window around ``n p`` holding all but 1e-18 of ``Bin(n, p)``'s mass (Bernstein's
    inequality), for the binomial variance ``n p (1 - p)`` (a tensor or a number)."""
    c = math.log(2 / _TAIL)
    return c / 3 + (c**2 / 9 + 2 * c * variance) ** 0.5


def _binomial_cdf_window(n: int, p: Tensor) -> tuple[Tensor, Tensor]:
    """CDF of ``Bin(n, p)`` on a window ``lo, lo+1, ..`` holding all but 1e-18 of the mass.

    ``p`` has shape ``(P,)``; returns ``lo`` of shape ``(P,)`` and the CDF of shape ``(P, W)``. ``W`` is the
    window of the widest case ``p = 1/2``, known on the host without reading ``p``: no device sync. The
    ``(P, W)`` work is one row gather and four in-place passes (``log C(n, k) + k logit p + n log(1 - p)``, exp,
    cumsum), no ``(P, W)`` temporaries: at SIR's amortized batch (10 000 windows of 322) the dozen temporaries
    before made a training step twice as long (docs/RESULTS.md, "The binomial quantile and SIR's amortized fit")."""
    half = _half_width(n * p * (1 - p))
    lo = torch.floor(n * p - half).clamp(min=0)
    width = min(n, 2 * math.ceil(_half_width(n / 4)) + 1) + 1
    past_n = torch.full((width,), -math.inf, device=p.device, dtype=p.dtype)  # k > n: probability 0
    log_c = torch.cat([log_binomial_coefficients(n, device=p.device, dtype=p.dtype), past_n])
    log_pmf = log_c.unfold(0, width, 1)[lo.long()]  # row i: log C(n, k) at k = lo_i .. lo_i + W - 1
    j = torch.arange(width, device=p.device, dtype=p.dtype)
    log_1mp = torch.log1p(-p)
    logit = torch.log(p) - log_1mp
    log_pmf.addcmul_(j, logit[:, None]).add_((lo * logit + n * log_1mp)[:, None])
    return lo, log_pmf.exp_().cumsum_(-1)


def binomial_icdf(u: Tensor, n: int, p: Tensor) -> Tensor:
    """Quantile of ``Bin(n, p)``: the smallest ``k`` with ``P(X <= k) >= u``, as float64.

    ``u`` and ``p`` broadcast. The CDF is computed once per distinct ``p`` entry (on a window wide
    enough that the mass outside it is below 1e-18, so the quantile is exact in float64) and the
    uniforms that share it are located by ``searchsorted``: with ``p`` of shape ``(N, 1, T)`` and
    ``u`` of shape ``(N, M, T)`` the work is that of N x T CDFs, not N x M x T. No per-element loop.
    """
    shape = torch.broadcast_shapes(u.shape, p.shape)
    p = p.double().reshape((1,) * (len(shape) - p.ndim) + p.shape)
    u = u.double().expand(shape)
    shared = [i for i in range(len(shape)) if p.shape[i] == 1 and shape[i] > 1]
    own = [i for i in range(len(shape)) if i not in shared]
    order = own + shared
    p_rows = p.expand([shape[i] if i in own else 1 for i in range(len(shape))]).permute(order)
    rows = p_rows.reshape(-1)
    u_rows = u.permute(order).reshape(rows.numel(), -1)
    out = torch.empty_like(u_rows)
    step = max(1, _CHUNK // (n + 1))
    for start in range(0, rows.numel(), step):  # chunks bound memory; each chunk is vectorized
        lo, cdf = _binomial_cdf_window(n, rows[start : start + step])
        idx = torch.searchsorted(cdf, u_rows[start : start + step].contiguous())
        out[start : start + step] = (lo[:, None] + idx).clamp(max=n)
    inverse = [order.index(i) for i in range(len(shape))]
    return out.reshape([shape[i] for i in order]).permute(inverse)


class BinomialCurve(Mechanism):
    """Release of an epidemic curve ``I_1..I_T`` (counts in a population of ``K``):

    ``y_t = Bin(N, (I_t + M) / (K + 2M)) / N``, independently over t. It is epsilon-DP with
    ``epsilon = T N log(1 + 1/M)`` (Prop. 4). Given a target ``epsilon`` the pseudo-count is
    ``M = T N / epsilon`` as in the paper's code, so the exact guarantee :attr:`epsilon` is a little
    below the target.
    """

    def __init__(
        self,
        trials: int,
        population: int,
        dim: int,
        epsilon: float | None = None,
        pseudo_count: float | None = None,
    ) -> None:
        if (epsilon is None) == (pseudo_count is None):
            raise ValueError("give exactly one of epsilon and pseudo_count")
        self.trials, self.population = (
            check_integer("trials", trials),
            check_integer("population", population),
        )
        if pseudo_count is None:
            pseudo_count = dim * self.trials / check_positive("epsilon", epsilon)
        self.pseudo_count = check_positive("pseudo_count", pseudo_count)
        super().__init__(dim, dim * self.trials * math.log1p(1 / self.pseudo_count))
        self.target_epsilon = self.epsilon if epsilon is None else float(epsilon)

    #: ``N y ~ Bin(N, p)``: ``asin(sqrt(y))`` has variance about ``1 / (4 N)`` whatever ``p`` (docs/RESULTS.md,
    #: "SIR's flow on the arcsine of its release").
    stabilizing_map = "arcsine"

    #: :meth:`with_epsilon` also takes a tensor of epsilons (see :mod:`dpsbi.mechanisms.epsilon`).
    batched_epsilon = True

    def with_epsilon(self, epsilon: float | Tensor) -> BinomialCurve:
        """The same release (trials, population, dim) calibrated at another target ``epsilon``: pseudo-count
        ``M = T N / epsilon``. A tensor of epsilons broadcasting with the summaries gives one mechanism
        drawing each row at its own epsilon (its ``pseudo_count`` a tensor; :mod:`dpsbi.mechanisms.epsilon`)."""
        if not torch.is_tensor(epsilon):
            return type(self)(self.trials, self.population, self.dim, epsilon=epsilon)
        target = epsilons(epsilon)
        pseudo_count = self.dim * self.trials / target
        exact = self.dim * self.trials * torch.log1p(1 / pseudo_count)
        return batched_copy(self, exact, pseudo_count=pseudo_count, target_epsilon=target)

    @property
    def lattice(self) -> float:
        """Releases are counts over ``N``: multiples of ``1 / N``."""
        return 1.0 / self.trials

    def probability(self, s: Tensor) -> Tensor:
        """Success probability ``(s + M) / (K + 2M)`` for counts ``s``."""
        return (as_float(s) + self.pseudo_count) / (self.population + 2 * self.pseudo_count)

    def transform(self, s: Tensor, u: Tensor) -> Tensor:
        k = binomial_icdf(u, self.trials, self.probability(s))
        return (k / self.trials).to(u.dtype)

    def log_prob(self, y: Tensor, s: Tensor) -> Tensor:
        self._check_shapes(y, s)
        k = self._counts(y)
        return binomial_log_pmf(k, self.trials, self.probability(s).double()).sum(-1).to(y.dtype)

    def max_log_prob(self, y: Tensor) -> Tensor:
        k = self._counts(y)
        lo = self.pseudo_count / (self.population + 2 * self.pseudo_count)
        p = (k / self.trials).clamp(lo, 1 - lo)
        return binomial_log_pmf(k, self.trials, p).sum(-1).to(y.dtype)

    def in_support(self, y: Tensor) -> Tensor:
        k = as_float(y).double() * self.trials
        return (
            ((k - k.round()).abs() <= 1e-6 * self.trials).all(-1)
            & (k >= -1e-9).all(-1)
            & (k <= self.trials + 1e-9).all(-1)
        )

    def _counts(self, y: Tensor) -> Tensor:
        """Binomial counts ``N y``, rounded when within float error of an integer."""
        k = as_float(y).double() * self.trials
        return torch.where((k - k.round()).abs() <= 1e-6 * self.trials, k.round(), k)

    def __repr__(self) -> str:
        return (
            f"BinomialCurve(dim={self.dim}, trials={self.trials}, population={self.population}, "
            f"pseudo_count={show(self.pseudo_count)}, epsilon={show(self.epsilon)})"
        )
