"""Does weighting the amortized loss toward rare releases move naive Bayes' worst release? A probe that patches
``dpsbi.SPPE.loss`` for one run of ``scripts/amortized_check.py`` (not a library feature).

Each training pair's plain loss ``-log q(theta | y, log epsilon)`` is weighted by ``h = clamp(D2 / k, 1, CAP) **
BETA``, normalized over the batch, where ``D2`` is the release's squared Mahalanobis distance (``k`` coordinates)
from the mean and covariance of 200 000 prior-predictive releases at log-uniform epsilon over the fit's range. A
weight that depends on the flow's context alone changes the marginal of the releases the loss averages over, not
the conditional: the optimal ``q(theta | y, log epsilon)`` is still the posterior, while a finite flow spends more
of itself on releases like naive Bayes' release 8 at epsilon 1.5 (``D2`` 29.8 at its own epsilon, rarer than 1
in 550). docs/RESULTS.md, "Three seeds at a million simulations, and rare releases weighted up".

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/release_emphasis_probe.py 1 10 --tasks naive_bayes \\
        --overrides '{"sims_per_round": 10000}' --out results/amortized_frontier/naive_bayes_emphasis_sims10k.jsonl
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for amortized_check

import torch  # noqa: E402
from amortized_check import main  # noqa: E402

import dpsbi  # noqa: E402
from dpsbi.inference.losses import inner_releases, posterior_loss, with_log_epsilon  # noqa: E402
from dpsbi.inference.training import Loss  # noqa: E402
from dpsbi.mechanisms.epsilon import log_uniform  # noqa: E402

RELEASES = 200_000
WHITENINGS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # by (id(task), low, high)


def whitening(task, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean ``(k,)`` and Cholesky factor ``(k, k)`` of ``RELEASES`` prior-predictive releases of ``task`` at
    log-uniform epsilon in ``[low, high]`` (fixed seed), computed once per task and range (every round asks)."""
    key = (id(task), low, high)
    if key not in WHITENINGS:
        generator = torch.Generator().manual_seed(4321)
        s = task.simulate(task.prior.sample((RELEASES,)), generator)
        epsilon = log_uniform(low, high, RELEASES, generator)
        y = inner_releases(s, task.mechanism, 1, False, generator, epsilon=epsilon)[:, 0].double()
        WHITENINGS[key] = y.mean(0), torch.linalg.cholesky(torch.cov(y.T))
    return WHITENINGS[key]


def patch(beta: float, cap: float) -> None:
    """``dpsbi.SPPE.loss`` replaced by the weighted plain loss (amortized fits: one release a pair, no atoms)."""
    plain = dpsbi.SPPE.loss

    def loss(self, round_index: int) -> Loss:
        mechanism, m, qmc = self.task.mechanism, self.inner_samples, self.qmc
        mean, chol = whitening(self.task, *self.epsilon_range)

        def compute(flow, batch, draws):
            z, s, _, _, *epsilon = batch
            eps = epsilon[0] if epsilon else None
            y = inner_releases(s, mechanism, m, qmc, epsilon=eps, u=draws[0])  # (N, M, k)
            terms = posterior_loss(flow, z, with_log_epsilon(y, eps), reduction="none")  # (N,)
            centred = (y - mean.to(y)).reshape(-1, y.shape[-1]).T
            d2 = (torch.linalg.solve_triangular(chol.to(y), centred, upper=False) ** 2).sum(0)
            weight = (d2.reshape(y.shape[:-1]).mean(-1) / y.shape[-1]).clamp(1.0, cap) ** beta
            return (weight * terms).sum() / weight.sum()

        return Loss(compute, plain(self, round_index).draw)

    dpsbi.SPPE.loss = loss


if __name__ == "__main__":
    patch(float(sys.argv[1]), float(sys.argv[2]))
    sys.argv = [sys.argv[0], *sys.argv[3:]]
    main()
