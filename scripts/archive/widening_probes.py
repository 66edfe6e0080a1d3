"""Three probes of ``SPPE(..., widening=...)`` on naive Bayes over epsilon 1-10 (docs/RESULTS.md, "Widened noise at
the default"), each printing one line per measurement; one torch thread.

``step``: CPU milliseconds of one amortized training step (draws, loss, backward, Adam) at batch 1000, with and
without widening, interleaved (widened, plain, widened, plain), the median of 50 steps after 10 of warm-up, each
after a one-step fit of 20 000 simulations.

``ratio SEED DIR``: the fit's release classifier ``log g`` (unclamped) at ``scripts/amortized_check.py``'s 20
prior-predictive releases at epsilon 1.5, refitted from the checkpoint of a widened default fit (``--posteriors
DIR`` of that script: ``DIR/naive_bayes``), as the fit itself refits it on resuming.

``draft``: the option's first draft (a widened cell drawn by the mechanism re-calibrated at ``epsilon / factor``,
its densities from the two calibrations), which seeds 0 and 1 of the naive-Bayes table ran, against the committed
``widened_releases`` (the noise scaled by ``factor``) on 20 000 naive-Bayes rows over epsilon 1-10: for Laplace
noise the same law; printed, the largest differences of the releases and of the log-weights.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/widening_probes.py step
    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/widening_probes.py draft
    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/widening_probes.py ratio 2 DIR
"""

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for amortized_check

import amortized_check  # noqa: E402
import torch  # noqa: E402

import dpsbi  # noqa: E402
from dpsbi.inference.losses import with_log_epsilon  # noqa: E402
from dpsbi.inference.widening import Widening, widened_releases  # noqa: E402
from dpsbi.mechanisms.epsilon import at_epsilons  # noqa: E402

TASK = {"name": "naive_bayes"}
RANGE = (1.0, 10.0)


def step_milliseconds(widening: dict | None, steps: int = 60, warm_up: int = 10) -> float:
    """The median CPU milliseconds of a training step at batch 1000, after ``warm_up`` unmeasured steps."""
    estimator = dpsbi.SPPE(
        amortized_check.load(TASK, 10**0.5),
        amortized=True,
        epsilon_range=RANGE,
        rounds=1,
        sims_per_round=20_000,
        widening=widening,
        training=dict(max_steps=1),
        progress=False,
    )
    estimator.run()
    loss, data = estimator.loss(0), estimator._dataset(False)
    optimizer = torch.optim.Adam(estimator.flow.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps):
        batch = tuple(t[torch.randint(0, data[0].shape[0], (1000,), generator=generator)] for t in data)
        began = time.process_time()
        value = loss.compute(estimator.flow, batch, loss.draw(1000, generator))
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        times.append(time.process_time() - began)
    return 1000 * sorted(times[warm_up:])[(steps - warm_up) // 2]


def release_log_ratio(seed: int, directory: Path) -> list[float]:
    """``log g`` at the 20 releases, from the classifier refitted on the checkpoint's first round."""
    task = amortized_check.load(TASK, 1.5)
    _, y = amortized_check.prior_predictive(task, 20, 100)
    estimator = dpsbi.SPPE(
        amortized_check.load(TASK, 10**0.5),
        amortized=True,
        epsilon_range=RANGE,
        widening={},
        seed=seed,
        checkpoint_dir=directory / "naive_bayes",
        progress=False,
    )
    estimator._resume()
    context = with_log_epsilon(y.float(), torch.full((20,), 1.5))
    return [round(float(v), 2) for v in estimator.release_ratio().logits(context)]


def draft_releases(mechanism, s, epsilon, u, pick, settings: Widening):
    """The first draft of ``widened_releases``: widened cells drawn by the mechanism at ``epsilon / factor``."""
    base = epsilon.reshape(-1, 1, 1)
    wide, s_row = base / settings.factor, s.unsqueeze(-2)
    y = at_epsilons(mechanism, torch.where(pick < settings.share, wide, base)).sample(s_row, u)
    plain = at_epsilons(mechanism, base).coordinate_log_prob(y, s_row)
    widened = at_epsilons(mechanism, wide).coordinate_log_prob(y, s_row)
    log_r = torch.logaddexp(plain + math.log1p(-settings.share), widened + math.log(settings.share))
    return y, (plain - log_r).sum(-1)


def draft_differences(n: int = 20_000) -> tuple[float, float]:
    """The largest differences of the releases and of the log-weights, draft against committed."""
    mechanism, settings = amortized_check.load(TASK, 10**0.5).mechanism, Widening()
    generator = torch.Generator().manual_seed(0)
    s = torch.rand(n, mechanism.dim, generator=generator)
    epsilon = torch.exp(torch.rand(n, generator=generator) * math.log(RANGE[1] / RANGE[0])) * RANGE[0]
    u, pick = (torch.rand(n, 1, mechanism.dim, generator=generator) for _ in range(2))
    (y, log_w), (y0, log_w0) = (
        f(mechanism, s, epsilon, u, pick, settings) for f in (widened_releases, draft_releases)
    )
    return float((y - y0).abs().max()), float((log_w - log_w0).abs().max())


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "step":
        for widening in ({}, None, {}, None):
            print("widened" if widening is not None else "plain", f"{step_milliseconds(widening):.1f} ms")
    elif sys.argv[1] == "draft":
        releases, weights = draft_differences()
        print(f"largest differences, releases and log-weights: {releases:.2g}, {weights:.2g}")
    else:
        print("log g at the 20 releases:", release_log_ratio(int(sys.argv[2]), Path(sys.argv[3])))
