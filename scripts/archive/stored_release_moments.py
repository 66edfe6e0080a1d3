"""An amortized fit saved by ``scripts/privacy_utility.py run --posteriors DIR`` against the reference posteriors
at its task's stored releases at epsilon 0.1, 1 and 10: per parameter the error of the posterior mean in reference
sds (``dpsbi.metrics.mean_shift``) and the sd and 95 % width ratios, 4000 draws a side. docs/RESULTS.md, "The
privacy-utility curve from one fit".

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/stored_release_moments.py DIR/sir.pt sir
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for frontier

import torch  # noqa: E402
from frontier import reference_for  # noqa: E402

import dpsbi  # noqa: E402
from dpsbi.experiment.config import build_task  # noqa: E402
from dpsbi.metrics import mean_shift, spread_ratios  # noqa: E402


def main(path: str, name: str) -> None:
    torch.set_num_threads(1)
    posterior = dpsbi.load_posterior(path)
    for epsilon in (0.1, 1.0, 10.0):
        config = {"name": name, "epsilon": epsilon}
        task = build_task(config)
        reference = reference_for(task, config, {}).samples[:4000]
        draws = posterior.sample((4000,), y=task.y_obs, epsilon=epsilon, seed=0).cpu()
        ratios = spread_ratios(draws, reference)
        print(
            f"epsilon {epsilon:g}: mean shift {[round(v, 2) for v in mean_shift(draws, reference)]}, "
            f"sd ratio {[round(v, 2) for v in ratios['sd_ratio']]}, "
            f"width95 ratio {[round(v, 2) for v in ratios['width95_ratio']]}"
        )


if __name__ == "__main__":
    main(*sys.argv[1:3])
