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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..mechanisms import Mechanism
from ..mechanisms.base import AdditiveNoise
from ..mechanisms.epsilon import at_epsilons
from .losses import noise_uniforms, with_log_epsilon
from .settings import Settings
from .training import Loss

#: Hidden units of the release classifier's two layers, and its batch.
CLASSIFIER_HIDDEN = 64
CLASSIFIER_BATCH = 1024


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


class ReleaseRatio(nn.Module):
    """``log g(c)``: the estimate of ``log r(c) / eta(c)`` for flow contexts ``c (..., k)`` (a release, then
    ``log epsilon`` with an epsilon range), clamped to ``[-log cap, log cap]``; shape ``(...)``."""

    def __init__(self, mean: Tensor, sd: Tensor, cap: float) -> None:
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("sd", sd)
        self.log_cap = math.log(cap)
        k = mean.shape[-1]
        self.net = nn.Sequential(
            nn.Linear(k, CLASSIFIER_HIDDEN),
            nn.ReLU(),
            nn.Linear(CLASSIFIER_HIDDEN, CLASSIFIER_HIDDEN),
            nn.ReLU(),
            nn.Linear(CLASSIFIER_HIDDEN, 1),
        )

    def logits(self, context: Tensor) -> Tensor:
        """The classifier's log odds (widened against plain) at ``context (..., k)``, unclamped: ``(...)``."""
        return self.net(((context - self.mean) / self.sd).to(self.mean)).squeeze(-1)

    def forward(self, context: Tensor) -> Tensor:
        return self.logits(context).clamp(-self.log_cap, self.log_cap).to(context.dtype)


def fit_release_ratio(
    mechanism: Mechanism, s: Tensor, epsilon: Tensor | None, settings: Widening, generator: torch.Generator
) -> ReleaseRatio:
    """A :class:`ReleaseRatio` fitted on one widened and one plain release of each summary ``s (n, dim_s)`` at
    its ``epsilon (n,)`` (or the mechanism's): logistic regression of widened (1) against plain (0) releases,
    equal counts, so the log odds estimate ``log r(y) / eta(y)``; Adam at 1e-3, ``classifier_steps`` batches of
    :data:`CLASSIFIER_BATCH`, all from ``generator`` (on ``s``'s device)."""
    n = s.shape[0]
    u = noise_uniforms(n, mechanism, 2, False, generator, device=s.device)
    pick = torch.rand(n, 2, mechanism.dim, generator=generator, device=s.device)
    pick = torch.cat([pick[:, :1], torch.ones_like(pick[:, 1:])], 1)  # the second release never widened
    y, _ = widened_releases(mechanism, s, epsilon, u, pick, settings)
    x = with_log_epsilon(y, epsilon).transpose(0, 1).reshape(2 * n, -1).float()  # widened rows, then plain
    label = torch.cat([torch.ones(n, device=s.device), torch.zeros(n, device=s.device)])
    with torch.random.fork_rng(devices=[]):  # the classifier's initial weights, from the generator too
        torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator, device=s.device)))
        ratio = ReleaseRatio(x.mean(0), x.std(0).clamp(min=1e-12), settings.cap).to(s.device)
    optimizer = torch.optim.Adam(ratio.net.parameters(), lr=1e-3)
    for _ in range(settings.classifier_steps):
        rows = torch.randint(0, 2 * n, (min(CLASSIFIER_BATCH, 2 * n),), generator=generator, device=s.device)
        loss = nn.functional.binary_cross_entropy_with_logits(ratio.logits(x[rows]), label[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return ratio.requires_grad_(False).eval()


def widened_loss(
    mechanism: Mechanism, inner_samples: int, qmc: bool, settings: Widening, ratio: ReleaseRatio
) -> Loss:
    """The plain SPPE loss on widened releases, weighted back to the exact posterior (module docstring): a batch
    of ``(z, s, log_prior, prior_rows[, epsilon])`` rows, ``inner_samples`` releases each."""

    def compute(flow, batch, draws):
        z, s, _, _, *epsilon = batch
        u, pick = draws
        eps = epsilon[0] if epsilon else None
        y, log_w = widened_releases(mechanism, s, eps, u, pick, settings)
        context = with_log_epsilon(y, eps)
        weight = torch.softmax((log_w.to(context) + ratio(context)).flatten(), 0).reshape(log_w.shape)
        return -(weight * flow.log_prob(z.unsqueeze(-2), context)).sum()

    def draw(rows: int, generator: torch.Generator) -> tuple[Tensor, ...]:
        u = noise_uniforms(rows, mechanism, inner_samples, qmc, generator)
        pick = torch.rand(*u.shape[:-1], mechanism.dim, generator=generator, device=u.device, dtype=u.dtype)
        return u, pick

    return Loss(compute, draw)
