"""Probes of the amortized narrow end that patch the library for one run (not library features): each registers a
variant of scripts/amortized_diagnosis.py, ``<probe>_sims10k_probe`` (the amortized defaults: 10 x 10 000,
per-epsilon z-scoring), and runs that script's ``run`` with the remaining arguments.

- ``tilt``: log epsilon drawn with density rising exponentially toward the narrow end, 4x at ``high`` what it is
  at ``low`` (log-uniform is 1x), so that more simulations carry the releases whose posteriors are narrowest.
- ``defensive``: half of every round's parameters are prior draws widened twofold about the prior mean in the
  flow's space, the other half plain prior draws (a defensive mixture), and the loss weights each simulation by
  prior / mixture density (at most 2), so that it still targets the posterior while prior-tail parameters get
  several times more simulations.

    .venv/bin/python scripts/amortized_probes.py run --probe tilt --variants tilt_sims10k_probe --seeds 0 \\
        --out results/amortized_diagnosis_probes.jsonl
"""

from __future__ import annotations

import argparse
import math
import sys

import amortized_diagnosis
import torch

import dpsbi
from dpsbi.inference import estimator
from dpsbi.inference.losses import sppe_loss
from dpsbi.inference.training import Loss

TILT = 4.0  # density of log epsilon at high over that at low
WIDEN, SHARE = 2.0, 0.5  # the widened prior's scale, and its share of the simulations


def tilted(low: float, high: float, n: int, generator=None, device=None) -> torch.Tensor:
    """``n`` epsilons in ``[low, high]`` whose log has density proportional to ``TILT ** t``, ``t`` the position
    in ``[log low, log high]`` (inverse CDF)."""
    u = torch.rand(n, generator=generator, device=device)
    t = torch.log1p(u * (TILT - 1)) / math.log(TILT)
    return torch.exp(math.log(low) + (math.log(high) - math.log(low)) * t)


def patch_tilt() -> None:
    estimator.log_uniform = tilted


def prior_centre(space) -> torch.Tensor:
    """The prior mean mapped to the flow's space: the point the defensive mixture widens about."""
    return space.to_z(space.prior.mean.to(space.device))


def patch_defensive() -> None:
    draw_and_simulate, plain_loss = estimator.SequentialEstimator._draw_and_simulate, dpsbi.SPPE.loss

    def widened(self, index, posterior):
        theta, s, generator = draw_and_simulate(self, index, posterior)
        k = int(SHARE * theta.shape[0])
        centre = prior_centre(self.space)
        theta, s = theta.clone(), s.clone()
        theta[:k] = self.space.to_theta(centre + WIDEN * (self.space.to_z(theta[:k]) - centre))
        s[:k] = self.task.simulate(theta[:k], torch.Generator().manual_seed(12345 + index))
        return theta, s, generator

    def tensors(self, z, s, rounds):  # prior / mixture log weights in place of the (unused) log prior
        centre = prior_centre(self.space)
        log_p = self.space.log_prior_z(z)
        log_wide = self.space.log_prior_z(centre + (z - centre) / WIDEN) - z.shape[-1] * math.log(WIDEN)
        mixture = torch.logsumexp(torch.stack([math.log(1 - SHARE) + log_p, math.log(SHARE) + log_wide]), 0)
        return z, s, log_p - mixture, torch.ones_like(log_p)

    def loss(self, round_index):
        mechanism, m, qmc = self.task.mechanism, self.inner_samples, self.qmc

        def compute(flow, batch, draws):
            z, s, log_weight, _, *epsilon = batch
            terms = sppe_loss(
                flow,
                z,
                s,
                mechanism,
                m,
                qmc,
                epsilon=epsilon[0] if epsilon else None,
                u=draws[0],
                reduction="none",
            )
            return (log_weight.exp() * terms).mean()

        return Loss(compute, plain_loss(self, round_index).draw)

    estimator.SequentialEstimator._draw_and_simulate = widened
    dpsbi.SPPE.tensors, dpsbi.SPPE.loss = tensors, loss


PROBES = {"tilt": patch_tilt, "defensive": patch_defensive}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", required=True, choices=list(PROBES))
    args, rest = parser.parse_known_args()
    PROBES[args.probe]()
    defaults = amortized_diagnosis.VARIANTS["per_epsilon_sims10k"]  # the amortized defaults, pinned
    amortized_diagnosis.VARIANTS[f"{args.probe}_sims10k_probe"] = dict(defaults)
    sys.argv = [sys.argv[0], *rest]
    amortized_diagnosis.main()


if __name__ == "__main__":
    main()
