"""Does training on releases with widened noise, importance-weighted back to the exact posterior, move naive Bayes'
worst release? A probe that patches ``dpsbi.SPPE.loss`` for one run of ``scripts/amortized_check.py`` (not a
library feature; SBC and TARP skipped: accuracy at the 20 releases per epsilon only).

Each inner release is drawn from the mixture ``r = (1 - LAMBDA) eta_eps + LAMBDA eta_{eps / C}`` (the
mechanism, or the same one at ``C`` times its noise scale; ``PER = "release"``), or from that mixture in each cell
independently (``PER = "cell"``: a product of per-coordinate mixtures, so that one cell far out and the others
as usual, the shape of a rare Laplace draw, is common), instead of ``eta_eps``, and its plain loss
``-log q(theta | y, log eps)`` is weighted by ``w = eta_eps(y | s) / r(y | s) * g(y, eps)``. For any ``g`` of the
flow's context alone, ``E_r[w (-log q)] = E_eta[g (-log q)]``: the optimal flow is still the exact posterior at
every release, and ``g`` only sets how much each release counts. ``g = r(y) / eta(y)`` (the releases' marginal
ratio, from a classifier of ``CLASSIFIER_RELEASES`` releases of each, fitted once, log clamped to
``[-log CAP, log CAP]``) makes the loss count releases as often as ``r`` draws them: a noise draw 8 scales out at
``C = 3`` is a 2.7-scale draw of the wide part; the cap bounds it to ``CAP`` times ``eta``'s frequency. The
weights are normalized over the batch. Arguments: ``C LAMBDA PER CAP``, then ``amortized_check.py``'s.
docs/RESULTS.md, "Every level in three seeds, and what naive Bayes' release 8 is (twentieth session)".

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/noise_widened_probe.py 3 0.25 release 30 --tasks naive_bayes \\
        --overrides '{"sims_per_round": 10000}' --out results/amortized_frontier/naive_bayes_widened_sims10k.jsonl
"""

import math
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for amortized_check

import amortized_check  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import dpsbi  # noqa: E402
from dpsbi.inference.losses import noise_uniforms, with_log_epsilon  # noqa: E402
from dpsbi.inference.training import Loss  # noqa: E402
from dpsbi.mechanisms.epsilon import at_epsilons, log_uniform  # noqa: E402

CLASSIFIER_RELEASES = 200_000
RATIOS: dict[tuple, Callable[[torch.Tensor], torch.Tensor]] = {}  # by (id(task), low, high)


def widened(eps: torch.Tensor, pick: torch.Tensor, share: float) -> torch.Tensor:
    """``eps (..., 1)`` divided by ``C`` where ``pick`` (uniforms ``(..., 1)`` or ``(..., k)``) is below ``share``."""
    return torch.where(pick < share, eps / C, eps)


def picks(shape: tuple[int, ...], k: int, generator, **kwargs) -> torch.Tensor:
    """The uniforms choosing the wide part: one per release or one per cell (``PER``)."""
    return torch.rand(*shape, k if PER == "cell" else 1, generator=generator, **kwargs)


def releases(task, n: int, low: float, high: float, wide: float, generator) -> torch.Tensor:
    """``n`` prior-predictive releases with ``log epsilon`` appended ``(n, k + 1)``, drawn from ``r`` with the
    wide part's share ``wide``."""
    s = task.simulate(task.prior.sample((n,)), generator)
    eps = log_uniform(low, high, n, generator).reshape(-1, 1)
    scaled = widened(eps, picks((n,), s.shape[-1], generator), wide)
    y = at_epsilons(task.mechanism, scaled).sample(s, generator=generator)
    return with_log_epsilon(y, eps.flatten())


def log_ratio(task, low: float, high: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function ``(n, k + 1) -> (n,)`` estimating ``log r(y, eps) / eta(y, eps)`` (a logistic classifier of releases
    drawn from ``r`` against releases drawn from ``eta``, equal counts), fitted once per task and range."""
    key = (id(task), low, high)
    if key not in RATIOS:
        generator = torch.Generator().manual_seed(4321)
        x = torch.cat(
            [releases(task, CLASSIFIER_RELEASES, low, high, share, generator) for share in (LAMBDA, 0.0)]
        )
        label = torch.cat([torch.ones(CLASSIFIER_RELEASES), torch.zeros(CLASSIFIER_RELEASES)])
        x = x.float()
        mean, sd = x.mean(0), x.std(0)
        net = nn.Sequential(
            nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
        )
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
        for _ in range(4000):
            rows = torch.randint(0, len(x), (1024,), generator=generator)
            logit = net((x[rows] - mean) / sd).squeeze(-1)
            loss = nn.functional.binary_cross_entropy_with_logits(logit, label[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        net.requires_grad_(False)
        RATIOS[key] = lambda release: net((release.float() - mean) / sd).squeeze(-1)
    return RATIOS[key]


def patch() -> None:
    """``dpsbi.SPPE.loss`` replaced by the widened, weighted plain loss (amortized fits: no atoms)."""

    def loss(self, round_index: int) -> Loss:
        mechanism, m, qmc = self.task.mechanism, self.inner_samples, self.qmc
        ratio = log_ratio(self.task, *self.epsilon_range)

        def compute(flow, batch, draws):
            z, s, _, _, eps = batch
            u, pick = draws
            eps_row, s_row = eps.reshape(-1, 1, 1), s.unsqueeze(-2)
            scaled = widened(eps_row, pick, LAMBDA)  # (N, M, 1) or (N, M, k)
            y = at_epsilons(mechanism, scaled).sample(s_row, u[..., : mechanism.noise_dim])
            cells = at_epsilons(mechanism, eps_row).coordinate_log_prob(y, s_row)  # (N, M, k)
            cells_wide = at_epsilons(mechanism, eps_row / C).coordinate_log_prob(y, s_row)
            if PER == "cell":
                log_r = torch.logaddexp(cells + math.log(1 - LAMBDA), cells_wide + math.log(LAMBDA)).sum(-1)
            else:
                log_r = torch.logaddexp(
                    cells.sum(-1) + math.log(1 - LAMBDA), cells_wide.sum(-1) + math.log(LAMBDA)
                )
            log_eta = cells.sum(-1)  # (N, M)
            context = with_log_epsilon(y, eps)
            log_g = (
                ratio(context.reshape(-1, context.shape[-1])).reshape(y.shape[:-1]).clamp(-LOG_CAP, LOG_CAP)
            )
            log_w = (log_eta - log_r).to(log_g) + log_g
            weight = torch.softmax(log_w.flatten(), 0).reshape(log_w.shape)
            terms = -flow.log_prob(z.unsqueeze(-2), context)  # (N, M)
            return (weight * terms).sum()

        def draw(rows: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
            u = noise_uniforms(rows, mechanism, m, qmc, generator)
            return u, picks(u.shape[:-1], mechanism.dim, generator, device=u.device, dtype=u.dtype)

        return Loss(compute, draw)

    dpsbi.SPPE.loss = loss
    amortized_check.calibration = lambda *args, **kwargs: {}


if __name__ == "__main__":
    C, LAMBDA, PER, LOG_CAP = (
        float(sys.argv[1]),
        float(sys.argv[2]),
        sys.argv[3],
        math.log(float(sys.argv[4])),
    )
    patch()
    sys.argv = [sys.argv[0], *sys.argv[5:]]
    amortized_check.main()
