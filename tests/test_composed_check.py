"""scripts/composed_check.py's task: three mechanisms (continuous, discrete, OpenDP-made) over the overlapping
statistics (a, b, a + b), its total privacy loss, and its exact likelihood against brute-force summation."""

import math

import pytest
import torch
from scipy import stats

pytest.importorskip("opendp")
import composed_check  # scripts/ is on the tests' path (pyproject.toml)  # noqa: E402

from dpsbi.mechanisms import DiscreteGaussian, DiscreteLaplace, Laplace  # noqa: E402


def test_the_blocks_their_accounting_and_the_release():
    task = composed_check.make_task()
    blocks = task.mechanism.blocks
    assert [type(b) for b in blocks] == [Laplace, DiscreteGaussian, DiscreteLaplace]
    assert blocks[2].scale == 2.0 and blocks[2].epsilon == 0.5  # OpenDP's make_geometric, scale 2
    privacy = task.mechanism.privacy()
    assert privacy.rho == pytest.approx(
        3 * 0.125
    )  # 0.5^2 / 2 for each pure block, plus the discrete Gaussian's
    assert privacy.epsilon == pytest.approx(
        0.5 + blocks[1].epsilon + 0.5
    )  # basic composition is tighter here
    y = task.y_obs[0]
    assert (
        y[1] == y[1].round() and y[2] == y[2].round() and y[0] != y[0].round()
    )  # integer blocks, one continuous
    s = task.simulate(torch.tensor([[20.0, 35.0]] * 5), torch.Generator().manual_seed(0))
    assert torch.equal(s[:, 2], s[:, 0] + s[:, 1])  # the third block releases the total


def test_the_exact_likelihood_is_the_brute_force_sum_over_the_counts():
    task = composed_check.make_task(release=[14.3, 40.0, 51.0])
    theta = torch.tensor([[20.0, 35.0], [5.0, 58.0], [1.0, 1.0]], dtype=torch.float64)
    a, b = torch.meshgrid(*[torch.arange(160, dtype=torch.float64)] * 2, indexing="ij")
    s = torch.stack([a, b, a + b], -1).reshape(-1, 3)
    log_eta = task.mechanism.log_prob(task.y_obs.double().expand(len(s), 3), s)
    for row, fast in zip(theta, task.exact_log_likelihood(theta)):
        log_pois = stats.poisson.logpmf(s[:, 0].numpy(), row[0].item()) + stats.poisson.logpmf(
            s[:, 1].numpy(), row[1].item()
        )
        brute = float(torch.logsumexp(log_eta + torch.from_numpy(log_pois), 0))
        assert math.isclose(float(fast), brute, rel_tol=1e-12, abs_tol=1e-9)
