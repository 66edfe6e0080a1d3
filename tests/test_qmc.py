"""Scrambled Sobol uniforms: shape, uniformity, net balance, independence, and RQMC's lower error."""

import math

import pytest
import torch
from scipy import stats

from dpsbi.qmc import sobol, uniforms


def test_shape_range_and_dtype():
    u = sobol(7, 16, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert u.shape == (7, 16, 3) and u.dtype == torch.float64
    assert (u > 0).all() and (u < 1).all()


def test_every_row_is_uniform_and_rows_differ():
    u = sobol(2000, 8, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for j in range(8):  # the j-th point of each row is an independent uniform draw
        assert stats.kstest(u[:, j, 0].numpy(), "uniform").pvalue > 1e-3
    assert not torch.equal(u[0], u[1])


def test_each_row_keeps_the_net_balance():
    """Scrambling preserves the (t, m, s)-net: every 1-d projection of a row of 2^k points puts one point
    in each interval [i / 2^k, (i + 1) / 2^k), and each 2-d projection of the first two dims is balanced."""
    m = 64
    u = sobol(50, m, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    cells = (u * m).floor().long()
    assert (cells.sort(dim=1).values == torch.arange(m)[None, :, None]).all()
    grid = (u[..., 0] * 8).floor().long() * 8 + (u[..., 1] * 8).floor().long()  # 8 x 8 boxes, one point each
    assert (grid.sort(dim=1).values == torch.arange(m)).all()


def test_rqmc_beats_mc_on_a_smooth_integrand():
    """RMSE over independent randomizations of the mean of exp(sum u / 3) over [0, 1]^3."""
    exact = (3 * (math.e ** (1 / 3) - 1)) ** 3
    g = torch.Generator().manual_seed(3)
    f = lambda u: torch.exp(u.sum(-1) / 3).mean(-1)  # noqa: E731
    rmse = {}
    for qmc in (True, False):
        for m in (16, 256):
            est = f(uniforms(400, m, 3, qmc=qmc, generator=g, dtype=torch.float64))
            rmse[qmc, m] = ((est - exact) ** 2).mean().sqrt().item()
    assert rmse[True, 16] < rmse[False, 16] / 5
    slope_qmc = math.log(rmse[True, 256] / rmse[True, 16]) / math.log(16)
    slope_mc = math.log(rmse[False, 256] / rmse[False, 16]) / math.log(16)
    assert slope_mc == pytest.approx(-0.5, abs=0.15)
    assert slope_qmc < -1.0  # Owen-scrambled nets: about M^-1.5 for smooth integrands


def test_seeded_reproducibility():
    a = sobol(3, 8, 2, generator=torch.Generator().manual_seed(5))
    b = sobol(3, 8, 2, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


@pytest.mark.parametrize("args", [(0, 8, 2), (4, 0, 2), (4, 8, 0), (4, 8, 100000)])
def test_bad_sizes_raise(args):
    with pytest.raises(ValueError):
        sobol(*args)
