"""Training releases with widened noise, weighted back to the exact posterior (``SPPE(..., widening=...)``).

An amortized fit learns ``q(theta | y)`` from the releases the mechanism draws, so a release whose noise lies far
out in one coordinate is as rare in training as it is in the prior predictive, and the flow misses the posterior
there: naive Bayes' release 8 (docs/RESULTS.md, "what naive Bayes' release 8 is") has one cell about 11 Laplace
scales off, and its posterior, flat over which cell took the noise, was the one release of 20 no amount of
training reached. With widening, each coordinate of a training release takes its noise ``factor`` times larger with
probability ``share`` (so ``r``, the releases' law given ``s``, is a product of per-coordinate mixtures, and one
cell far out with the others as usual is common), and each release's plain loss
``-log q(theta | y)`` is weighted by

    w = eta(y | s) / r(y | s) * g(y),        g(y) ~ r(y) / eta(y) clamped to [1 / cap, cap],

the weights normalized over the batch. For any ``g`` of the flow's context alone ``E_r[w (-log q)] =
E_eta[g (-log q)]``, so the exact posterior stays the loss's optimum at every release; ``g`` only says how much
each release counts, and the releases' marginal ratio (a classifier of widened against plain releases, fitted
once per fit on the first round's summaries: :func:`fit_release_ratio`) makes the loss count releases as often as
``r`` draws them, capped at ``cap`` times their natural frequency.

SPLE's likelihood flow ``q(y | theta)`` is a density over the release, so there ``g`` may not be any function of
it: the loss's optimum becomes ``q(y | theta) ~ eta(y | theta) g(y) / c(theta)``, ``c(theta) = E[g(y) | theta]``,
which moves the posterior unless ``c`` is constant. It is where ``g`` reads only the release's *ancillary* part:
its coordinates along directions in which the statistic never varies (naive Bayes' counts of each class sum to the
same total for every feature, and all cells to two per record), where a release is the statistic's constant plus
pure noise whose law does not depend on ``theta``. SPLE widens those fits only (:func:`ancillary_basis`), and its
``g`` is the marginal ratio of that part (:class:`ReleaseRatio` with a ``basis``). (The weights are normalized over
the batch, a ratio estimate whose bias, of the order of one weight against the batch's sum, is left: the largest
of 4000 weights on naive Bayes was 0.3 % of their sum.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..mechanisms import Mechanism
from ..mechanisms.base import AdditiveNoise
from ..mechanisms.epsilon import at_epsilons
from ..seeds import seeded_global_streams
from .losses import noise_uniforms, with_log_epsilon
from .settings import Settings
from .training import Loss

#: Hidden units of the release classifier's two layers, and its batch.
CLASSIFIER_HIDDEN = 64
CLASSIFIER_BATCH = 1024
#: A direction is ancillary where the summaries' spread along it is at most this share of their largest (float32
#: sums of proportions leave singular values ~1e-6 along naive Bayes' constraints, against ~10 across them, over
#: 1000 tables), and where it is at most :data:`ANCILLARY_NOISE_SHARE` of the noise's spread along it.
ANCILLARY_RTOL = 1e-5
ANCILLARY_NOISE_SHARE = 1e-3


@dataclass(frozen=True)
class Widening(Settings):
    """How training releases are widened: each coordinate's noise ``factor`` times larger with probability
    ``share`` (for Laplace noise, the mechanism at ``epsilon / factor``); the releases' marginal ratio estimated by
    a classifier trained for ``classifier_steps`` Adam steps and capped at ``cap``. The defaults are the setting
    measured on naive Bayes over epsilon 1-10 at the million-simulation default (docs/RESULTS.md, "Widened noise at
    the default"): its rare release (one cell 11 noise scales out) went from C2ST 0.714-0.722 to 0.565-0.574 in
    three seeds (0.579-0.611 at ``share=0.1``), every release of the 180 at most 0.574; on regression over 0.1-10,
    whose worst releases lie in the prior's tails rather than the noise's, epsilon 10 lost (mean 0.552 at share
    0.2, 0.542 at 0.1, against 0.522 plain; one seed), hence off by default."""

    label: ClassVar[str] = "widening"
    factor: float = 5.0
    share: float = 0.2
    cap: float = 1000.0
    classifier_steps: int = 4000

    def __post_init__(self) -> None:
        if not (self.factor > 1 and 0 < self.share < 1 and self.cap >= 1 and self.classifier_steps >= 1):
            raise ValueError(
                "widening needs factor > 1, 0 < share < 1, cap >= 1 and classifier_steps >= 1, got "
                f"factor={self.factor}, share={self.share}, cap={self.cap}, classifier_steps={self.classifier_steps}"
            )


def widening_problem(mechanism: Mechanism) -> str | None:
    """Why ``mechanism``'s training releases cannot be widened, or ``None``: widening scales the noise of single
    coordinates, so it needs independent continuous noise per coordinate added to the statistic (Laplace,
    Gaussian)."""
    if not isinstance(mechanism, AdditiveNoise) or mechanism.lattice is not None:
        return f"widening needs independent continuous noise per coordinate (Laplace, Gaussian), not {mechanism!r}"
    return None


def resolve_widening(
    widening: Widening | dict | bool | None, default: bool, amortized: bool, mechanism: Mechanism
) -> Widening | None:
    """An estimator's ``widening`` argument as settings (``None``: ``default``; ``True``: the defaults; ``False``:
    none), refused in one line for a fit at ``y_obs`` or a mechanism it does not apply to."""
    widening = default if widening is None else widening
    settings = Widening() if widening is True else None if widening is False else Widening.coerce(widening)
    if settings is not None and not amortized:
        raise ValueError("widening weights the plain loss of an amortized fit; pass amortized=True")
    problem = None if settings is None else widening_problem(mechanism)
    if problem:
        raise ValueError(problem)
    return settings


def widened_releases(
    mechanism: Mechanism, s: Tensor, epsilon: Tensor | None, u: Tensor, pick: Tensor, settings: Widening
) -> tuple[Tensor, Tensor]:
    """Releases ``y (N, M, dim)`` of the summaries ``s (N, dim_s)`` at each row's ``epsilon (N,)`` (``None``: the
    mechanism's own) from the uniforms ``u (N, M, noise_dim)``, coordinate ``j``'s noise ``factor`` times larger
    where ``pick (N, M, dim)`` is below ``share``; and ``log eta(y | s) - log r(y | s)``, shape ``(N, M)``."""
    if epsilon is not None:
        mechanism = at_epsilons(mechanism, epsilon.reshape(-1, 1, 1))
    s_row = s.unsqueeze(-2)
    noise = mechanism.sample(s_row, u[..., : mechanism.noise_dim]) - s_row
    noise = noise * torch.where(pick < settings.share, settings.factor, 1.0)
    plain = mechanism.noise_log_prob(noise)
    widened = mechanism.noise_log_prob(noise / settings.factor) - math.log(settings.factor)
    log_r = torch.logaddexp(plain + math.log1p(-settings.share), widened + math.log(settings.share))
    return s_row + noise, (plain - log_r).sum(-1)


def release_features(y: Tensor, epsilon: Tensor | None, basis: Tensor | None) -> Tensor:
    """What :class:`ReleaseRatio` reads of releases ``y (N, ..., dim)`` at each row's ``epsilon (N,)``: ``y``, or its
    coordinates along ``basis (k, dim)``'s rows, then ``log epsilon`` with an epsilon range: ``(N, ..., k[+1])``."""
    return with_log_epsilon(y if basis is None else y @ basis.T.to(y), epsilon)


class ReleaseRatio(nn.Module):
    """``log g``: the estimate of ``log r / eta`` of the releases' features (a release, or its coordinates along
    ``basis (k, dim)``'s rows; then ``log epsilon`` with an epsilon range), clamped to ``[-log cap, log cap]``."""

    def __init__(self, mean: Tensor, sd: Tensor, cap: float, basis: Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("sd", sd)
        self.register_buffer("basis", basis)
        self.log_cap = math.log(cap)
        k = mean.shape[-1]
        self.net = nn.Sequential(
            nn.Linear(k, CLASSIFIER_HIDDEN),
            nn.ReLU(),
            nn.Linear(CLASSIFIER_HIDDEN, CLASSIFIER_HIDDEN),
            nn.ReLU(),
            nn.Linear(CLASSIFIER_HIDDEN, 1),
        )

    def logits(self, features: Tensor) -> Tensor:
        """The classifier's log odds (widened against plain) at ``features (..., k)``, unclamped: ``(...)``."""
        return self.net(((features - self.mean) / self.sd).to(self.mean)).squeeze(-1)

    def forward(self, y: Tensor, epsilon: Tensor | None) -> Tensor:
        """``log g`` at releases ``y (N, ..., dim)`` and ``epsilon (N,)``: ``(N, ...)``."""
        return (
            self.logits(release_features(y, epsilon, self.basis))
            .clamp(-self.log_cap, self.log_cap)
            .to(y.dtype)
        )


def fit_release_ratio(
    mechanism: Mechanism,
    s: Tensor,
    epsilon: Tensor | None,
    settings: Widening,
    generator: torch.Generator,
    basis: Tensor | None = None,
) -> ReleaseRatio:
    """A :class:`ReleaseRatio` fitted on one widened and one plain release of each summary ``s (n, dim_s)`` at
    its ``epsilon (n,)`` (or the mechanism's), reading the releases along ``basis (k, dim_s)`` where given:
    logistic regression of widened (1) against plain (0) releases, equal counts, so the log odds estimate
    ``log r / eta`` of those features; Adam at 1e-3, ``classifier_steps`` batches of :data:`CLASSIFIER_BATCH`, all
    from ``generator`` (on ``s``'s device)."""
    n = s.shape[0]
    u = noise_uniforms(n, mechanism, 2, False, generator, device=s.device)
    pick = torch.rand(n, 2, mechanism.dim, generator=generator, device=s.device)
    pick = torch.cat([pick[:, :1], torch.ones_like(pick[:, 1:])], 1)  # the second release never widened
    y, _ = widened_releases(mechanism, s, epsilon, u, pick, settings)
    x = (
        release_features(y, epsilon, basis).transpose(0, 1).reshape(2 * n, -1).float()
    )  # widened rows, then plain
    label = torch.cat([torch.ones(n, device=s.device), torch.zeros(n, device=s.device)])
    seed = int(torch.randint(2**62, (1,), generator=generator, device=s.device))
    with seeded_global_streams(seed):  # the classifier's initial weights, from the generator too
        ratio = ReleaseRatio(x.mean(0), x.std(0).clamp(min=1e-12), settings.cap, basis).to(s.device)
    optimizer = torch.optim.Adam(ratio.net.parameters(), lr=1e-3)
    for _ in range(settings.classifier_steps):
        rows = torch.randint(0, 2 * n, (min(CLASSIFIER_BATCH, 2 * n),), generator=generator, device=s.device)
        loss = nn.functional.binary_cross_entropy_with_logits(ratio.logits(x[rows]), label[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return ratio.requires_grad_(False).eval()


def widened_loss(
    mechanism: Mechanism,
    inner_samples: int,
    qmc: bool,
    settings: Widening,
    ratio: ReleaseRatio,
    log_prob: Callable[[nn.Module, Tensor, Tensor, Tensor | None], Tensor],
    with_epsilon: bool,
) -> Loss:
    """The plain loss on widened releases, weighted back (module docstring): ``-sum w log_prob(flow, z, y,
    epsilon)`` with ``log_prob`` the estimator's ``(N, M)`` log density of its pairs, over a batch of ``(z, s,
    ...[, epsilon])`` rows (``epsilon`` last where ``with_epsilon``), ``inner_samples`` releases each."""

    def compute(flow, batch, draws):
        z, s, eps = batch[0], batch[1], batch[-1] if with_epsilon else None
        u, pick = draws
        y, log_w = widened_releases(mechanism, s, eps, u, pick, settings)
        weight = torch.softmax((log_w.to(y) + ratio(y, eps)).flatten(), 0).reshape(log_w.shape)
        return -(weight * log_prob(flow, z, y, eps)).sum()

    def draw(rows: int, generator: torch.Generator) -> tuple[Tensor, ...]:
        u = noise_uniforms(rows, mechanism, inner_samples, qmc, generator)
        pick = torch.rand(*u.shape[:-1], mechanism.dim, generator=generator, device=u.device, dtype=u.dtype)
        return u, pick

    return Loss(compute, draw)


def ancillary_basis(s: Tensor) -> Tensor:
    """Orthonormal rows ``(k, dim_s)`` spanning the directions along which the summaries ``s (n, dim_s)`` do not
    vary (their spread at most :data:`ANCILLARY_RTOL` of the largest): the statistic's linear constraints;
    ``(0, dim_s)`` where it has none."""
    s = s.double()
    _, spread, directions = torch.linalg.svd(s - s.mean(0), full_matrices=True)
    spread = torch.cat([spread, spread.new_zeros(directions.shape[0] - len(spread))])  # n < dim_s: more free
    return directions[spread <= ANCILLARY_RTOL * spread[0]].float()


def plain_noise(mechanism: Mechanism, s: Tensor, epsilon: float | None, generator: torch.Generator) -> Tensor:
    """One draw of the mechanism's noise ``(n, dim_s)`` on each summary ``s (n, dim_s)``, at ``epsilon`` where given."""
    mechanism = mechanism if epsilon is None else mechanism.with_epsilon(epsilon)
    u = noise_uniforms(len(s), mechanism, 1, False, generator, device=s.device)[:, 0]
    return mechanism.sample(s, u) - s


def ancillary_directions(
    mechanism: Mechanism,
    s: Tensor,
    epsilon: float | None,
    generator: torch.Generator,
    basis: Tensor | None = None,
    required: bool = True,
) -> Tensor | None:
    """``basis`` (found on the summaries ``s (n, dim_s)`` where ``None``: :func:`ancillary_basis`), checked against
    one draw of the mechanism's noise at ``epsilon`` (its largest trained on) from ``generator``; where
    :func:`ancillary_problem` finds one, a one-line ``ValueError`` (``required``) or ``None``."""
    basis = ancillary_basis(s) if basis is None else basis.to(s.device)
    problem = ancillary_problem(basis, s, plain_noise(mechanism, s, epsilon, generator))
    if problem and required:
        raise ValueError(problem)
    return None if problem else basis


def ancillary_problem(basis: Tensor, s: Tensor, noise: Tensor) -> str | None:
    """Why ``basis (k, dim_s)`` cannot be read as the releases' ancillary part for the summaries ``s (n, dim_s)``
    with ``noise (n, dim_s)`` (the mechanism's, at its smallest), or ``None``: it is empty, or the summaries vary
    along it by more than :data:`ANCILLARY_NOISE_SHARE` of the noise's spread there."""
    if not len(basis):
        return (
            "SPLE widens a likelihood flow's releases only along directions in which the statistic never varies "
            "(its linear constraints), and this task's statistic has none: pass widening=False"
        )
    s, basis = s.double(), basis.double()
    share = float(((s - s.mean(0)) @ basis.T).std(0).max() / (noise.double() @ basis.T).std(0).min())
    if share > ANCILLARY_NOISE_SHARE:
        return (
            f"the statistic varies along its constrained directions by {share:.2g} of the noise's sd there (at most "
            f"{ANCILLARY_NOISE_SHARE:g} keeps SPLE's widening exact): pass widening=False"
        )
    return None
