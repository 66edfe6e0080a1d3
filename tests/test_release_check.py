"""The release check: a release that no training simulation came near warns in one line naming its coordinates,
at fit time (``task.y_obs``) and at sampling time (any release), from statistics kept in posterior files;
releases drawn like the training releases are flagged at the designed rate."""

import csv
import warnings

import numpy as np
import pytest
import torch

import dpsbi
from dpsbi import cli
from dpsbi.inference import posterior_file
from dpsbi.inference.release_check import (
    ReleaseOutsideTraining,
    TrainingReleases,
    false_alarm_bound,
    outside_training_caught,
)
from dpsbi.tasks import load

TINY = dict(flow=dict(transforms=1, hidden=8), training=dict(max_steps=5), progress=False)


def _no_clamp(theta, rng):
    """A simulator that forgot its clamp: summaries near 1000 where the release is near 0."""
    return 1000 + theta + torch.randn(theta.shape, generator=rng)


def _task(y_obs=(0.1, 0.3)):
    return dpsbi.from_simulator(
        dpsbi.tasks.box([-3.0, 0.2], [3.0, 3.0]),
        _no_clamp,
        dpsbi.mechanisms.Laplace(1.0, 0.35, dim=2),
        list(y_obs),
        name="no_clamp",
    )


def _fit(estimator, task, **kwargs):
    budget = dict(num_simulations=200) if estimator is dpsbi.NaiveNPE else dict(rounds=1, sims_per_round=200)
    return estimator(task, **budget, **TINY, **kwargs).run()


@pytest.fixture(scope="module")
def inside():
    """An amortized SPPE fit whose y_obs (near 1000) lies inside its training releases."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReleaseOutsideTraining)
        return _fit(dpsbi.SPPE, _task((1000.0, 1001.0)))


@pytest.mark.parametrize("estimator", [dpsbi.SPPE, dpsbi.SPLE, dpsbi.NaiveNPE])
def test_a_y_obs_no_simulation_came_near_warns_at_fit_time(estimator):
    with pytest.warns(ReleaseOutsideTraining) as caught:
        _fit(estimator, _task((0.1, 1001.0)))
    messages = [str(w.message) for w in caught if w.category is ReleaseOutsideTraining]
    assert len(messages) == 1 and "\n" not in messages[0]
    message = messages[0]
    assert message.startswith(
        f"{estimator.method}: task 'no_clamp''s y_obs lies outside the 200 simulated releases"
    )
    assert "y0 = 0.1 (training releases span [" in message and "y1" not in message
    assert "a warning, not a proof" in message


def test_a_release_far_out_warns_at_sampling_naming_the_coordinate(inside):
    with pytest.warns(ReleaseOutsideTraining, match=r"the release lies outside .* y0 = 1e\+30") as caught:
        inside.sample((10,), y=[1e30, 1000.0])
    assert "y1 =" not in str(caught[0].message)
    with pytest.warns(
        ReleaseOutsideTraining, match=r"1 of 3 releases \(row 2\) lie outside .* row 2: y1 = -50"
    ):
        inside.sample_batched((10,), y=[[1000.0, 1001.0], [1001.0, 1000.0], [1000.0, -50.0]])
    with pytest.warns(ReleaseOutsideTraining, match="y0 = 0"):
        inside.log_prob(torch.tensor([[0.0, 1.0]]), y=[0.0, 1000.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReleaseOutsideTraining)
        inside.sample((10,), y=[1000.5, 1000.5])  # inside: no warning
        inside.log_prob(torch.tensor([[0.0, 1.0]]), y=[999.5, 1001.0])


def test_a_release_off_the_joint_cloud_is_flagged_jointly():
    """Two coordinates that move together: each value seen before, their combination never."""
    x = torch.randn(4000, 1, generator=torch.Generator().manual_seed(0))
    checked = TrainingReleases.of(torch.cat([x, x + 0.01 * torch.randn(4000, 1)], 1))
    y = torch.tensor([[2.0, -2.0], [2.0, 2.0]])
    assert checked.flags(y, ["a", "b"]) in (["jointly: a", ""], ["jointly: b", ""])
    assert "Mahalanobis distance" in checked.warning(y, ["a", "b"], "test")


@pytest.mark.parametrize("name", ["conjugate_gaussian", "poisson_counts", "regression"])
def test_no_false_alarm_at_the_paper_tasks_y_obs(name):
    """(Every registered task's y_obs at its default epsilon lies inside 1000 and 10 000 prior-predictive releases.)"""
    task = load(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReleaseOutsideTraining)
        posterior = _fit(dpsbi.SPPE, task, amortized=True)
        posterior.sample((10,), y=task.y_obs)
    assert posterior.training_releases.count == 200


@pytest.mark.parametrize("count", [200, 1000])
def test_releases_drawn_like_the_training_ones_are_flagged_at_the_designed_rate(count):
    """Over 200 training sets (correlated Gaussian and heavy-tailed Laplace coordinates) and 50 fresh draws each,
    the flagged fraction stays within Monte Carlo error of at most 2 / (count // 2 + 1), the conformal bound."""
    generator = torch.Generator().manual_seed(1)
    sets, fresh, mixing = 200, 50, torch.tensor([[1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.0, 0.0, 1.0]])

    def draw(n):
        gaussian = torch.randn(n, 2, generator=generator)
        laplace = torch.distributions.Laplace(0.0, 1.0).sample((n, 1))
        return torch.cat([gaussian, laplace], 1) @ mixing.T * torch.tensor([1.0, 10.0, 0.1]) + 5

    flagged = torch.stack(
        [TrainingReleases.of(draw(count)).outside(draw(fresh)).rows.double().mean() for _ in range(sets)]
    )
    rate, bound = float(flagged.mean()), false_alarm_bound(count)
    error = float(flagged.std()) / sets**0.5
    assert rate <= bound + 4 * error
    assert rate >= 0.5 / (count // 2 + 1) - 4 * error  # each statistic alone exceeds its limit at 1 / (m + 1)


def test_the_statistics_travel_in_posterior_files_and_older_files_load_unchecked(inside, tmp_path):
    path = tmp_path / "posterior.pt"
    inside.save(path)
    loaded = dpsbi.load_posterior(path, task=inside.task)
    assert loaded.training_releases.to_dict() == inside.training_releases.to_dict()
    with pytest.warns(ReleaseOutsideTraining, match="y0 = 1e\\+30"):
        loaded.sample((5,), y=[1e30, 1000.0])
    meta = inside.metadata()
    del meta["training_releases"]  # as written before the check
    posterior_file.write(path, meta, inside.flow.state_dict())
    older = dpsbi.load_posterior(path, task=inside.task)
    posterior_file.write(path, {**meta, "training_releases": {"count": 3}}, inside.flow.state_dict())
    with pytest.raises(ValueError, match="damaged dpsbi posterior file"):
        dpsbi.load_posterior(path, task=inside.task)
    assert older.training_releases is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReleaseOutsideTraining)
        older.sample((5,), y=[1e30, 1000.0])


def test_dpsbi_sample_flags_the_rows_outside_and_warns_once(tmp_path, capsys):
    task = load("conjugate_gaussian", epsilon=1.0, dim=2)
    posterior = _fit(dpsbi.SPPE, task, amortized=True)
    path = tmp_path / "posterior.pt"
    posterior.save(path)
    releases, summary = tmp_path / "releases.csv", tmp_path / "summary.csv"
    with open(releases, "w", newline="") as f:
        csv.writer(f).writerows([["y0", "y1"], [0.1, 0.2], [1e30, 0.0], [0.0, -0.3]])
    cli.sample([str(path), "--releases", str(releases), "-n", "20", "--summary", str(summary)])
    with open(summary, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["outside_training"] for row in rows] == ["", "", "y0", "y0", "", ""]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "dpsbi-sample: warning: SPPE posterior: 1 of 3 releases (row 1)"
    )
    assert err[0].endswith("(column outside_training of the summary)")
    cli.sample([str(path), "--release=1e30,0", "-n", "20"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "y0 = 1e+30" in err[0] and err[0].startswith("dpsbi-sample: warning:")
    np.testing.assert_equal(posterior.training_releases.flags(torch.tensor([[0.1, 0.2]]), ["y0", "y1"]), [""])


def test_a_resumed_fit_has_the_statistics_of_an_uninterrupted_one(tmp_path):
    task = load("conjugate_gaussian")
    settings = dict(sims_per_round=100, atoms=2, **TINY)
    whole = dpsbi.SPPE(task, rounds=2, **settings).run()
    dpsbi.SPPE(task, rounds=1, checkpoint_dir=tmp_path, **settings).run()
    resumed = dpsbi.SPPE(task, rounds=2, checkpoint_dir=tmp_path, **settings).run()
    assert whole.training_releases.count == 200
    assert resumed.training_releases.to_dict() == whole.training_releases.to_dict()


def test_outside_training_caught_keeps_the_lines_and_shows_every_other_warning():
    with pytest.warns(RuntimeWarning, match="other") as shown:
        with outside_training_caught() as lines:
            warnings.warn("far out", ReleaseOutsideTraining, stacklevel=1)
            warnings.warn("other", RuntimeWarning, stacklevel=1)
            warnings.warn("far out again", ReleaseOutsideTraining, stacklevel=1)
    assert lines == ["far out", "far out again"]
    assert [w.category for w in shown] == [RuntimeWarning]
    with pytest.warns(ReleaseOutsideTraining):  # restored on leaving
        warnings.warn("after", ReleaseOutsideTraining, stacklevel=1)
