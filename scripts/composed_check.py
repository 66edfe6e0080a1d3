"""The held-out check of composed releases (issue 32): three mechanisms, one of them made by OpenDP, over
overlapping statistics of a model with an exact posterior, fitted by ``SPPE(task)`` and ``SPLE(task)`` at
their defaults on one torch thread, scored after every round against the exact posterior. Regenerates
``results/composed_check.jsonl`` and the RESULTS subsection "Three mechanisms composed, one made by OpenDP".

The model: two districts' case counts ``a ~ Poisson(rate_a)``, ``b ~ Poisson(rate_b)``, prior ``rate_a, rate_b ~
U(1, 60)`` independently. The curators release, on the same confidential counts,

- ``a`` with (continuous) Laplace noise, epsilon 0.5 (dpsbi's :class:`~dpsbi.mechanisms.Laplace`);
- ``b`` with discrete Gaussian noise, rho 1/8 (sigma 2; dpsbi's :class:`~dpsbi.mechanisms.DiscreteGaussian`);
- the total ``a + b`` with OpenDP's ``make_geometric`` (discrete Laplace, scale 2: epsilon 0.5), read by
  :func:`~dpsbi.mechanisms.from_opendp`;

so the statistic is ``s = (a, b, a + b)`` and the mechanism is ``Composition([Laplace, DiscreteGaussian,
from_opendp(...)])``; its total privacy loss (rho summed, converted at delta) is printed and recorded. The exact
likelihood sums over the counts: ``p(y | theta) = sum_{a, b} Pois(a) Pois(b) eta_0(y_0 | a) eta_1(y_1 | b)
eta_2(y_2 | a + b)``, a (K+1) x (K+1) Hankel form per theta with each block's own ``log_prob``
(:func:`exact_log_likelihood`, K = 200: the Poisson mass left out is below 1e-40 at rate 60), and the
reference posterior is importance sampling with it (:func:`dpsbi.experiment.reference.likelihood_importance`).

Every round appends a JSON line to ``--out`` (the scorer of ``scripts/real_release_check.py``): method, round,
simulations, C2ST of ``--draws`` posterior draws against as many reference draws, ``sd_ratio`` per parameter
(posterior sd over the reference's), ``cpu_seconds`` (the process's CPU time for the fit so far, the draws
scored included, scoring excluded: on one torch thread, the time on one dedicated core), wall ``seconds``; a
last line per fit sums it up.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/composed_check.py
    .venv/bin/python scripts/composed_check.py --methods SPPE --overrides '{"rounds": 1}' --out /tmp/c.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

import dpsbi
from dpsbi.experiment.reference import likelihood_importance
from dpsbi.mechanisms import Composition, DiscreteGaussian, Laplace, from_opendp

ROOT = Path(__file__).resolve().parents[1]
TRUE_THETA = [20.0, 35.0]
LOW, HIGH = 1.0, 60.0
#: Largest count the exact likelihood sums over (P(Poisson(60) > 200) < 1e-40).
K = 200


def opendp_total():
    """The OpenDP measurement that releases the total: ``make_geometric`` on an integer, scale 2."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp.m.make_geometric(dp.atom_domain(T=int), dp.absolute_distance(T=int), scale=2.0)


def mechanism() -> Composition:
    """``Composition([Laplace on a, discrete Gaussian on b, OpenDP's geometric on a + b])``: three blocks of one
    coordinate each, on ``s = (a, b, a + b)`` (one case more or less moves each block's statistic by at most 1)."""
    return Composition(
        [
            Laplace(0.5, 1.0),
            DiscreteGaussian.from_rho(0.125, 1.0, 1),
            from_opendp(opendp_total(), sensitivity=1),
        ]
    )


def simulate(theta: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Confidential ``(a, b, a + b)`` ``(n, 3)`` for ``theta = (rate_a, rate_b)`` ``(n, 2)``."""
    counts = torch.poisson(theta.double(), generator)
    return torch.cat([counts, counts.sum(-1, keepdim=True)], -1)


def exact_log_likelihood(composition: Composition, y: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """``log p(y | theta)`` ``(n,)`` (float64) of the release ``y (3,)`` for ``theta (n, 2)``: with ``u_a =
    Pois(a; rate_a) eta_0(y_0 | a)``, ``v_b = Pois(b; rate_b) eta_1(y_1 | b)`` and ``W_ab = eta_2(y_2 | a + b)``,
    ``p = u^T W v``, every factor rescaled to a peak of 1 in log space (sums of nonnegative terms: no
    cancellation), counts ``0..K``."""
    y = torch.as_tensor(y, dtype=torch.float64).reshape(3)
    first, second, third = composition.blocks
    k = torch.arange(K + 1, dtype=torch.float64)[:, None]
    log_eta_a = first.log_prob(y[None, :1].expand(K + 1, 1), k)
    log_eta_b = second.log_prob(y[None, 1:2].expand(K + 1, 1), k)
    log_w = third.log_prob(
        y[None, 2:].expand(2 * K + 1, 1), torch.arange(2 * K + 1, dtype=torch.float64)[:, None]
    )
    index = torch.arange(K + 1)
    log_w = log_w[index[:, None] + index[None, :]]  # (K + 1, K + 1): eta_2(y_2 | a + b)
    theta = torch.as_tensor(theta, dtype=torch.float64).reshape(-1, 2)
    log_pois = torch.distributions.Poisson(theta[:, :, None]).log_prob(k[:, 0])  # (n, 2, K + 1)
    log_u, log_v = log_pois[:, 0] + log_eta_a, log_pois[:, 1] + log_eta_b
    peak_u, peak_v, peak_w = log_u.amax(-1, keepdim=True), log_v.amax(-1, keepdim=True), log_w.max()
    inner = ((log_u - peak_u).exp() @ (log_w - peak_w).exp() * (log_v - peak_v).exp()).sum(-1)
    return inner.log() + (peak_u + peak_v)[:, 0] + peak_w


def make_task(release=None, seed: int = 0) -> dpsbi.Task:
    """The task at ``release`` (3 numbers), or at the release drawn from :data:`TRUE_THETA` with ``seed``; it
    carries ``exact_log_likelihood(theta)`` at its release."""
    composition = mechanism()
    if release is None:
        generator = torch.Generator().manual_seed(seed)
        s = simulate(torch.tensor([TRUE_THETA]), generator)
        release = composition.sample(s, generator=generator)[0].tolist()
    task = dpsbi.from_simulator(
        prior=dpsbi.tasks.box([LOW, LOW], [HIGH, HIGH]),
        simulator=simulate,
        mechanism=composition,
        y_obs=release,
        name="composed_counts",
        parameter_names=["rate_a", "rate_b"],
        release_names=["a + Laplace", "b + discrete Gaussian", "a + b + OpenDP geometric"],
        true_theta=[TRUE_THETA],
    )
    task.exact_log_likelihood = lambda theta: exact_log_likelihood(composition, task.y_obs[0], theta)
    return task


def main(argv: list[str] | None = None) -> None:
    from real_release_check import fit  # the scorer of the clamped-release check (this folder)

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["SPPE", "SPLE"], choices=["SPPE", "SPLE"])
    parser.add_argument("--seed", type=int, default=0, help="seed of the release drawn at the true theta")
    parser.add_argument("--draws", type=int, default=2000, help="posterior draws scored per round")
    parser.add_argument(
        "--reference-draws", type=int, default=20_000, help="importance draws of the reference"
    )
    parser.add_argument(
        "--overrides",
        type=json.loads,
        default={},
        help="estimator arguments as JSON (a smoke test: '{\"rounds\": 1}')",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "composed_check.jsonl")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.out.parent.mkdir(parents=True, exist_ok=True)

    task = make_task(seed=args.seed)
    privacy = task.mechanism.privacy()
    release = task.y_obs[0].tolist()
    print(f"release {release}; {task.mechanism}", flush=True)
    print(
        f"total privacy loss: rho = {privacy.rho:.4f} zCDP, epsilon = {privacy.epsilon:.3f} at delta = "
        f"{privacy.delta:g} ({privacy.rule})",
        flush=True,
    )
    began = time.process_time()
    reference, info = likelihood_importance(task, args.reference_draws, args.draws, seed=args.seed)
    print(
        f"reference: ESS {info['ess']:.0f} of {args.reference_draws}, {time.process_time() - began:.1f} CPU s"
    )
    common = {
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "overrides": args.overrides,
        "privacy": privacy._asdict(),
        "reference_ess": round(info["ess"]),
    }
    for name in args.methods:
        last = fit(
            getattr(dpsbi, name), task, reference, release, args.out, args.draws, common, args.overrides
        )
        print(json.dumps(last), flush=True)


if __name__ == "__main__":
    main()
