"""``dpsbi-sample --releases FILE.csv``: many releases (each with its epsilon) in, draws in long form and a
per-release summary out, from one batched call."""

import csv

import numpy as np
import pytest
import torch

import dpsbi
from dpsbi import cli
from dpsbi.tasks import load

RELEASES = [[0.5, -0.2, 0.6], [1.5, 0.0, 1.2], [-1.0, 2.0, 3.0]]  # y_1, y_2, epsilon


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A posterior over epsilon in [0.5, 4] on the conjugate Gaussian, saved, and its releases CSV."""
    task = load("conjugate_gaussian", epsilon=1.0, noise_sd=0.5, sensitivity=0.25, dim=2)
    posterior = dpsbi.SPPE(
        task,
        amortized=True,
        epsilon_range=(0.5, 4.0),
        rounds=1,
        sims_per_round=200,
        flow=dict(transforms=2, hidden=16),
        training=dict(max_steps=50),
        progress=False,
    ).run()
    directory = tmp_path_factory.mktemp("sample_cli")
    path = directory / "posterior.pt"
    posterior.save(path)
    releases = directory / "releases.csv"
    _write(releases, ["y1", "y2", "epsilon"], RELEASES)
    return path, releases, posterior


def _write(path, header, rows):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def test_releases_csv_gives_long_draws_and_a_summary(saved, tmp_path, capsys):
    path, releases, posterior = saved
    draws_csv, summary_csv = tmp_path / "draws.csv", tmp_path / "summary.csv"
    cli.sample(
        [
            str(path),
            "--releases",
            str(releases),
            "-n",
            "400",
            "-o",
            str(draws_csv),
            "--summary",
            str(summary_csv),
        ]
    )
    header, rows = _read(draws_csv)
    assert header == ["release", "draw", "theta_1", "theta_2"] and len(rows) == 3 * 400
    values = np.array(rows, dtype=float)
    assert sorted(set(values[:, 0])) == [0, 1, 2] and values[:400, 1].tolist() == list(range(400))
    # the same draws as one sample_batched call, release by release
    expected = posterior.sample_batched(
        (400,), y=torch.tensor(RELEASES)[:, :2], epsilon=torch.tensor(RELEASES)[:, 2], seed=0
    )
    for b in range(3):
        np.testing.assert_allclose(
            values[values[:, 0] == b, 2:], expected[:, b].double().numpy(), rtol=1e-5, atol=1e-5
        )
    header, rows = _read(summary_csv)
    assert header == ["release", "parameter", "mean", "sd", "q2.5", "q50", "q97.5"] and len(rows) == 3 * 2
    first = {row[1]: [float(v) for v in row[2:]] for row in rows if row[0] == "0"}
    mean, sd, low, median, high = first["theta_1"]
    column = expected[:, 0, 0].double()
    assert mean == pytest.approx(float(column.mean()), rel=1e-5) and sd == pytest.approx(
        float(column.std()), rel=1e-4
    )
    assert low < median < high and median == pytest.approx(float(column.median()), abs=0.05)
    out = capsys.readouterr().out
    assert "400 draws at each of 3 releases" in out and "q97.5" in out


def test_without_an_epsilon_column_the_task_epsilon_or_the_flag_is_used(saved, tmp_path, capsys):
    path, _, posterior = saved
    releases = tmp_path / "plain.csv"
    _write(releases, ["a", "b"], [row[:2] for row in RELEASES])
    summary = tmp_path / "summary.csv"
    cli.sample([str(path), "--releases", str(releases), "-n", "100", "--summary", str(summary)])
    _, rows = _read(summary)
    y = torch.tensor(RELEASES)[:, :2]
    at_task = posterior.sample_batched((100,), y=y, epsilon=1.0, seed=0)  # the task's own epsilon
    assert float(rows[0][2]) == pytest.approx(float(at_task[:, 0, 0].mean()), rel=1e-5)
    cli.sample(
        [str(path), "--releases", str(releases), "-n", "100", "--summary", str(summary), "--epsilon", "3"]
    )
    _, rows = _read(summary)
    at_three = posterior.sample_batched((100,), y=y, epsilon=3.0, seed=0)
    assert float(rows[0][2]) == pytest.approx(float(at_three[:, 0, 0].mean()), rel=1e-5)


@pytest.mark.parametrize(
    "header, rows, extra, message",
    [
        (["y1", "y2", "epsilon"], [[0.0, 0.0, 9.0]], [], "outside the range"),
        (["y1", "y2", "y3"], [[0.0, 0.0, 1.0]], [], "shape"),
        (["y1", "y2"], [[0.0, "x"]], [], "numbers"),
        (["y1", "y2"], [[0.0]], [], "1 values for 2 columns"),
        (["y1", "y2", "epsilon"], [[0.0, 0.0, 1.0]], ["--epsilon", "2"], "leave --epsilon out"),
        (["y1", "y2"], [[0.0, 0.0]], ["--release", "1,2"], "either"),
    ],
)
def test_bad_releases_files_are_refused_in_one_line(saved, tmp_path, header, rows, extra, message):
    path, _, _ = saved
    releases = tmp_path / "bad.csv"
    _write(releases, header, rows)
    with pytest.raises(SystemExit) as error:
        cli.sample([str(path), "--releases", str(releases), "-n", "10", *extra])
    assert message in str(error.value) and str(error.value).startswith("dpsbi-sample: error:")


def test_one_release_at_an_epsilon(saved, capsys):
    path, _, posterior = saved
    cli.sample([str(path), "--release=0.5,-0.2", "--epsilon", "2.5", "-n", "200"])
    assert "200 draws" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="outside the range"):
        cli.sample([str(path), "--release=0.5,-0.2", "--epsilon", "0.1"])
