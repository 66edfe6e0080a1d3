"""Can the default flow represent naive Bayes' exact posterior at its hardest amortized release? Release 8 of
``scripts/amortized_check.py``'s 20 prior-predictive releases at epsilon 1.5 (seed 100): the default
``FlowSettings`` fitted by maximum likelihood to 50 000 exact draws there (a constant context, Adam 1e-3 with
cosine decay, batches of 1000, ``STEPS`` steps), then scored against 2000 fresh exact draws: C2ST, the sd ratio
and the mean shift per parameter. Also written: the release in counts, the exact posterior's class count
``P(n_1 | y)`` and the support of each block's count ``a_ik`` at its mode (where the release's noise leaves the
likelihood flat, the posterior spreads over it), and, given a saved amortized fit, that fit's quantiles beside
the exact ones. One JSON line to the file given. docs/RESULTS.md, "Every level in three seeds, and what naive
Bayes' release 8 is (twentieth session)".

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/release8_representable.py results/amortized_frontier/naive_bayes_release8_representable.jsonl [saved.pt]
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for amortized_check

import torch  # noqa: E402
from amortized_check import load, prior_predictive  # noqa: E402

import dpsbi  # noqa: E402
from dpsbi.inference.flows import ConditionalFlow, FlowSettings  # noqa: E402
from dpsbi.metrics import c2st, mean_shift, spread_ratios  # noqa: E402

EPSILON, RELEASE, DRAWS, TRAIN, STEPS = 1.5, 8, 2000, 50_000, 4000
QUANTILES = [0.025, 0.25, 0.5, 0.75, 0.975]


def structure(posterior, y: torch.Tensor) -> dict:
    """The release in counts, the likeliest class counts and each block's support (weights > 1e-3) at the mode."""
    mode = int(posterior.class_weights.argmax())
    support = {}
    for i in range(2):
        for k in range(2):
            kept = (posterior.block_weights[:, mode, i, k] > 1e-3).nonzero().flatten()
            support[f"a_{i + 1}{k + 1}"] = [int(kept.min()), int(kept.max())]
    top = torch.topk(posterior.class_weights, 5)
    return {
        "release_counts": [round(v, 1) for v in (y * posterior.n).tolist()],
        "n_1_likeliest": top.indices.tolist(),
        "n_1_probabilities": [round(v, 3) for v in top.values.tolist()],
        "block_support_at_mode": support,
    }


def scores(draws: torch.Tensor, exact: torch.Tensor) -> dict:
    """C2ST of ``draws`` against ``exact``, and each parameter's sd ratio and mean shift (in exact sds)."""
    return {
        "c2st": round(c2st(draws, exact), 4),
        "sd_ratio": [round(v, 3) for v in spread_ratios(draws, exact)["sd_ratio"]],
        "shift": [round(v, 3) for v in mean_shift(draws, exact)],
    }


def quantiles(draws: torch.Tensor) -> list[list[float]]:
    """Each parameter's ``QUANTILES`` ``(d, 5)``."""
    q = torch.tensor(QUANTILES, dtype=draws.dtype)
    return [[round(v, 3) for v in draws[:, j].quantile(q).tolist()] for j in range(draws.shape[1])]


def fitted(task, posterior) -> tuple[ConditionalFlow, torch.Tensor]:
    """The default flow fitted to ``TRAIN`` exact draws in the task's unconstrained space, and the context."""
    z = task.transform.inv(posterior.sample((TRAIN,)).reshape(TRAIN, -1)).float()
    context = torch.zeros(1, 1)
    flow = ConditionalFlow(FlowSettings(), z, torch.randn(TRAIN, 1))
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, STEPS)
    for _ in range(STEPS):
        loss = -flow.log_prob(z[torch.randint(0, TRAIN, (1000,))], context).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return flow, context


def main(out: Path, saved: str | None) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    task = load({"name": "naive_bayes"}, EPSILON)
    _, y = prior_predictive(task, 20, seed=100)
    posterior = task.exact_posterior(y[RELEASE][None])
    row = {"release": RELEASE, "epsilon": EPSILON, **structure(posterior, y[RELEASE])}
    exact = posterior.sample((DRAWS,)).reshape(DRAWS, -1)
    row["parameters"] = task.parameter_names
    row["exact_quantiles"] = quantiles(exact)
    if saved:
        amortized = dpsbi.load_posterior(saved, task=load({"name": "naive_bayes"}, 10**0.5))
        draws = amortized.sample((DRAWS,), y=y[RELEASE], epsilon=EPSILON, seed=RELEASE)
        row["amortized"] = {"file": saved, **scores(draws, exact), "quantiles": quantiles(draws)}
    began = time.process_time()
    flow, context = fitted(task, posterior)
    with torch.no_grad():
        draws = task.transform(flow.sample(torch.randn(DRAWS, flow.dim), context).double())
    row["fitted_to_exact_draws"] = {
        "draws": TRAIN,
        "steps": STEPS,
        "cpu_s": round(time.process_time() - began),
        **scores(draws, exact),
    }
    with out.open("a") as file:
        print(json.dumps(row), file=file)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
