"""The exact-model SIR references kept in dpsbi/data/references: provenance, ESS, integrity, matching, and a
short SPPE run scored against one."""

import json
import shutil

import pytest
import torch

import dpsbi
from dpsbi.experiment import stored_references
from dpsbi.experiment.reference import reference_posterior
from dpsbi.files import CorruptFileError
from dpsbi.metrics import c2st

EPSILONS = (0.1, 1.0, 10.0)
#: Least Kish ESS a stored reference must have: with ESS >= 1000 its mean is within ~0.03 posterior sd.
MIN_ESS = 1000


def sir(epsilon: float, **kwargs):
    return dpsbi.tasks.load("sir", epsilon=epsilon, **kwargs)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_each_stored_sir_reference_has_its_provenance_and_enough_ess(epsilon):
    csv = stored_references.STORE / f"sir_eps{epsilon:g}.csv"
    draws, provenance = stored_references.read(csv)
    assert provenance["task"]["kwargs"]["simulator"] == "exact"
    assert provenance["ess"] >= MIN_ESS and provenance["importance_draws"] > provenance["ess"]
    assert provenance["command"].startswith("NUMBA_NUM_THREADS=1 python scripts/sir_references.py")
    assert draws.shape == (provenance["num_draws"], 2) and torch.isfinite(draws).all()
    # the smoothed resample keeps the weighted mean and sd (within 5 of its Monte Carlo errors: sd / sqrt(n) and
    # sd / sqrt(2n)), and repeats no draw
    sd, n = torch.tensor(provenance["weighted_sd"]), draws.shape[0]
    assert ((draws.mean(0) - torch.tensor(provenance["weighted_mean"])).abs() < 5 * sd / n**0.5).all()
    assert ((draws.std(0) / sd - 1).abs() < 5 / (2 * n) ** 0.5).all()
    assert torch.unique(draws, dim=0).shape[0] == n
    assert f"sir_eps{epsilon:g}.csv" in (stored_references.STORE / "README.md").read_text()


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_the_experiment_layer_uses_them_for_the_exact_model_only(epsilon):
    reference = reference_posterior(
        sir(epsilon), {"name": "sir", "epsilon": epsilon}, "auto", 500, cache_dir=None
    )
    assert reference.kind == "stored" and reference.samples.shape == (500, 2)
    for other in (
        sir(epsilon, simulator="tau_leap"),
        sir(epsilon, population=100_000),
        sir(epsilon, y_obs="simulate"),
    ):
        assert stored_references.find(other) is None
    with pytest.raises(ValueError, match="no stored reference"):
        reference_posterior(sir(epsilon, simulator="tau_leap"), {}, "stored", 500)


def test_a_damaged_or_foreign_entry_is_refused(tmp_path):
    for suffix in (".csv", ".json"):
        shutil.copy(stored_references.STORE / f"sir_eps1{suffix}", tmp_path / f"sir_eps1{suffix}")
    csv = tmp_path / "sir_eps1.csv"
    lines = csv.read_text().splitlines()
    lines[5] = lines[5].replace("-", "+", 1) if "-" in lines[5] else "0" + lines[5]
    csv.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptFileError, match="checksum"):
        stored_references.read(csv)
    with pytest.raises(CorruptFileError):
        stored_references.find(sir(1.0), store=tmp_path)
    provenance = json.loads((tmp_path / "sir_eps1.json").read_text())
    assert any("epsilon" in m for m in stored_references.mismatches(provenance, sir(10.0)))
    (tmp_path / "sir_eps1.json").write_text("{ truncated")
    with pytest.raises(CorruptFileError, match="provenance"):
        stored_references.find(sir(1.0), store=tmp_path)


def test_smoothed_resampling_keeps_mean_and_covariance_without_repeats():
    """Weighted draws of N(0, I) reweighted to N(1, 0.5^2 I): the smoothed resample has that mean and sd."""
    from dpsbi.baselines import smoothed_resample

    task = sir(1.0)
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(20_000, 2, generator=generator, dtype=torch.float64)
    log_w = torch.distributions.Normal(1.0, 0.5).log_prob(z).sum(-1) - torch.distributions.Normal(
        0.0, 1.0
    ).log_prob(z).sum(-1)
    weights = torch.softmax(log_w, 0)
    draws, h = smoothed_resample(task, z, weights, 20_000, generator)
    assert 0 < h < 0.5 and torch.unique(draws, dim=0).shape[0] == 20_000
    # 5 Monte Carlo errors: those of the weighted moments (Kish ESS ~2800) plus the resample's (20 000 draws)
    ess = float(1 / (weights**2).sum())
    assert ((draws.mean(0) - 1).abs() < 5 * 0.5 * (1 / ess + 1 / 20_000) ** 0.5).all()
    assert ((draws.std(0) - 0.5).abs() < 5 * 0.5 * (1 / (2 * ess) + 1 / 40_000) ** 0.5).all()


def test_smoothed_resampling_refuses_weights_too_few_for_a_covariance():
    """One draw carrying nearly all the weight (ESS ~1 < 2 per dimension): one clear line, not a linear-algebra
    error from the kernel's Cholesky factor."""
    from dpsbi.baselines import smoothed_resample

    task = sir(1.0)
    weights = torch.full((100,), 1e-6)
    weights[0] = 1.0
    samples = task.prior.sample((100,))
    with pytest.raises(ValueError, match=r"effective sample size \(1\.0\) is below two per dimension \(4\)"):
        smoothed_resample(task, samples, weights, 10, torch.Generator().manual_seed(0))


@pytest.mark.slow
def test_a_short_sppe_run_on_the_exact_sir_model_scores_against_the_stored_reference():
    """One round of 500 exact simulations: far from converged, but far closer than the prior."""
    task = sir(1.0)
    reference = reference_posterior(task, {}, "stored", 1000).samples
    posterior = dpsbi.SPPE(
        task, 1, 500, 4, atoms=5, training=dict(max_epochs=30), seed=0, progress=False
    ).run()
    draws = posterior.sample((1000,), generator=torch.Generator().manual_seed(0))
    prior = task.prior.sample((1000,))
    score, prior_score = c2st(draws, reference), c2st(prior, reference)
    assert prior_score > 0.95 and score < prior_score - 0.05, (score, prior_score)
