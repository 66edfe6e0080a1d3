"""``dpsbi-sample --releases FILE.csv``: many releases (each with its epsilon) in, draws in long form and a
per-release summary out, from one batched call."""

import csv

import numpy as np
import pytest
import torch

import dpsbi
from dpsbi import cli
from dpsbi.tasks import load

RELEASES = [[0.5, -0.2, 0.6], [1.5, 0.0, 1.2], [-1.0, 2.0, 3.0]]  # y0, y1, epsilon


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
    _write(releases, ["y0", "y1", "epsilon"], RELEASES)
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
    assert header == list(cli.RELEASE_SUMMARY_COLUMNS) and len(rows) == 3 * 2
    assert header[-1] == "outside_training" and all(
        row[-1] == "" for row in rows
    )  # inside the training cloud
    first = {row[1]: [float(v) for v in row[2:-1]] for row in rows if row[0] == "0"}
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
    _write(releases, ["y0", "y1"], [row[:2] for row in RELEASES])
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
        (["y0", "y1", "epsilon"], [[0.0, 0.0, 9.0]], [], "outside the range"),
        (["y0", "y1", "y2"], [[0.0, 0.0, 1.0]], [], "unknown column 'y2'; expected the header y0,y1"),
        (
            ["y0", "Y1"],
            [[0.0, 1.0]],
            [],
            "unknown column 'Y1' (names are case-sensitive: 'y1'?); missing column 'y1'",
        ),
        (["y0", "y1", "y1"], [[0.0, 1.0, 1.0]], [], "duplicated column 'y1'"),
        (["y1"], [[0.0]], [], "missing column 'y0'; expected the header y0,y1"),
        (["y0", "y1", "epsilon", "epsilon"], [[0.0, 1.0, 1.0, 1.0]], [], "duplicated column 'epsilon'"),
        (["0.5", "-0.2"], [[1.5, 0.0]], [], "a header is required; expected the header y0,y1"),
        (["y0", "y1"], [], [], "a header and no release"),
        (["y0", "y1"], [[0.0, "x"]], [], "numbers"),
        (["y0", "y1"], [[0.0]], [], "1 values for 2 columns"),
        (["y0", "y1", "epsilon"], [[0.0, 0.0, 1.0]], ["--epsilon", "2"], "leave --epsilon out"),
        (["y0", "y1"], [[0.0, 0.0]], ["--release", "1,2"], "either"),
    ],
)
def test_bad_releases_files_are_refused_in_one_line(saved, tmp_path, header, rows, extra, message):
    path, _, _ = saved
    releases = tmp_path / "bad.csv"
    _write(releases, header, rows)
    with pytest.raises(SystemExit) as error:
        cli.sample([str(path), "--releases", str(releases), "-n", "10", *extra])
    assert message in str(error.value) and str(error.value).startswith("dpsbi-sample: error:")


def test_columns_are_read_by_name_in_any_order(saved, tmp_path):
    """A file headed ``epsilon,y1,y0`` is the same releases as ``y0,y1,epsilon``, reordered; no row is dropped."""
    path, releases, _ = saved
    shuffled = tmp_path / "shuffled.csv"
    _write(shuffled, ["epsilon", "y1", "y0"], [[e, b, a] for a, b, e in RELEASES])
    summaries = []
    for source in (releases, shuffled):
        summary = tmp_path / f"summary_{source.stem}.csv"
        cli.sample([str(path), "--releases", str(source), "-n", "50", "--summary", str(summary)])
        summaries.append(_read(summary)[1])
    assert summaries[0] == summaries[1] and len(summaries[0]) == 3 * 2


NAMED_MODEL = """
import dpsbi
from dpsbi.tasks import load


def make_task():
    task = load("conjugate_gaussian", epsilon=1.0, dim=2)
    return dpsbi.from_simulator(
        task.prior, task.simulator, task.mechanism, task.y_obs, release_names=["b", "a"], name="named"
    )
"""


def test_a_task_names_its_release_columns(tmp_path, monkeypatch):
    """A task's ``release_names`` are the CSV's columns, matched by name (a task without them: y0, y1, ...)."""
    assert load("conjugate_gaussian", epsilon=1.0, dim=2).release_names == ["y0", "y1"]
    (tmp_path / "named_model.py").write_text(NAMED_MODEL)
    monkeypatch.chdir(tmp_path)
    task = load("custom", factory="named_model:make_task")
    assert task.release_names == ["b", "a"]
    posterior = dpsbi.SPPE(
        task,
        rounds=1,
        sims_per_round=100,
        flow=dict(transforms=1, hidden=8),
        training=dict(max_steps=5),
        progress=False,
    ).run()
    posterior.save(tmp_path / "posterior.pt")
    _write(tmp_path / "releases.csv", ["a", "b"], [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])
    cli.sample(["posterior.pt", "--releases", "releases.csv", "-n", "20", "--summary", "summary.csv"])
    expected = posterior.sample_batched((20,), y=torch.tensor([[0.2, 0.1], [0.4, 0.3], [0.6, 0.5]]), seed=0)
    means = [float(row[2]) for row in _read(tmp_path / "summary.csv")[1]]
    np.testing.assert_allclose(means, expected.mean(0).flatten().double().numpy(), rtol=1e-5, atol=1e-6)
    _write(tmp_path / "releases.csv", ["y0", "y1"], [[0.1, 0.2]])
    with pytest.raises(
        SystemExit, match="unknown columns 'y0', 'y1'; missing columns 'b', 'a'; expected the header b,a"
    ):
        cli.sample(["posterior.pt", "--releases", "releases.csv", "-n", "20"])
    with pytest.raises(ValueError, match="must be 2 distinct strings"):
        dpsbi.from_simulator(task.prior, task.simulator, task.mechanism, task.y_obs, release_names=["a"])
    with pytest.raises(ValueError, match="may not use 'epsilon'"):
        dpsbi.from_simulator(
            task.prior, task.simulator, task.mechanism, task.y_obs, release_names=["a", "epsilon"]
        )


def test_one_release_at_an_epsilon(saved, capsys):
    path, _, posterior = saved
    cli.sample([str(path), "--release=0.5,-0.2", "--epsilon", "2.5", "-n", "200"])
    assert "200 draws" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="outside the range"):
        cli.sample([str(path), "--release=0.5,-0.2", "--epsilon", "0.1"])


def test_one_release_corrected_by_importance_sampling(saved, capsys, tmp_path):
    path, _, posterior = saved
    cli.sample([str(path), "--release=0.5,-0.2", "--epsilon", "2.5", "-n", "200", "--correct", "5000"])
    out = capsys.readouterr()
    ess = float(out.out.split("effective sample size ")[1].split()[0])
    assert 200 <= ess <= 5000 and "200 draws" in out.out and "warning" not in out.err
    written = tmp_path / "draws.csv"
    cli.sample(
        [
            str(path),
            "--release=0.5,-0.2",
            "--epsilon",
            "2.5",
            "-n",
            "3000",
            "--correct",
            "300",
            "-o",
            str(written),
        ]
    )
    assert "without repeats" in capsys.readouterr().err  # 300 proposals cannot give 3000 distinct draws
    draws = np.loadtxt(written, delimiter=",", skiprows=1)
    assert len(np.unique(draws, axis=0)) == 3000
    with pytest.raises(SystemExit, match="--correct goes with one release"):
        cli.sample([str(path), "--releases", "x.csv", "--correct", "100"])
    with pytest.raises(SystemExit, match="--correct and --simulations-per-draw must be >= 1"):
        cli.sample([str(path), "--release=0.5,-0.2", "--epsilon", "2.5", "--correct", "0"])
    with pytest.raises(SystemExit, match="--correct and --simulations-per-draw must be >= 1"):
        cli.sample([str(path), "--release=0.5,-0.2", "--correct", "10", "--simulations-per-draw", "0"])
    with pytest.raises(SystemExit, match="--simulations-per-draw goes with --correct N"):
        cli.sample([str(path), "--release=0.5,-0.2", "--epsilon", "2.5", "--simulations-per-draw", "4"])


def test_a_run_sampled_from_another_folder_says_where_to_run(tmp_path, monkeypatch):
    """A custom task's module is imported from the working directory: from elsewhere, dpsbi-sample says so (not
    dpsbi-run's hint about task.y_obs)."""
    run = tmp_path / "run"
    (run / "sppe").mkdir(parents=True)
    (run / "config.yaml").write_text(
        "task:\n  name: custom\n  factory: elsewhere_model:make_task\nmethod:\n  name: sppe\n"
    )
    (run / "sppe" / "posterior.pt").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    for extra in ([], ["--releases", "releases.csv"]):
        with pytest.raises(SystemExit) as error:
            cli.sample([str(run), *extra])
        message = str(error.value)
        assert "run dpsbi-sample in the folder dpsbi-run ran in" in message and "y_obs" not in message
        assert "\n" not in message and "elsewhere_model" in message


# --- --release and --release-file: one release, or one line naming the file and what it holds ----------------
def _save_npy(array):
    return lambda path: np.save(path, np.asarray(array))


def _save_pt(value):
    return lambda path: torch.save(value, path)


def _truncated_pt(path):
    torch.save(torch.tensor([0.62, 1.87]), path)
    path.write_bytes(path.read_bytes()[:200])


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("obj.json", '{"mean": 0.62, "x": 1.87}', "holds a dict (keys 'mean', 'x'), not a release"),
        ("dict.pt", _save_pt({"mean": torch.tensor(0.62)}), "holds a dict (keys 'mean'), not a release"),
        ("strings.json", '["0.62", 1.87]', "something other than numbers"),
        ("random.pt", bytes(range(256)) * 4, "is not a readable torch file"),
        ("truncated.pt", _truncated_pt, "is not a readable torch file"),
        ("empty.pt", b"", "is not a readable torch file"),
        ("random.npy", bytes(range(256)), "is not a readable .npy array"),
        ("bad.json", "[0.62, ", "is not valid JSON"),
        ("two.npy", _save_npy([[0.1, 0.2], [0.3, 0.4]]), "holds 2 rows (shape (2, 2)): several releases"),
        ("two.json", "[[0.1, 0.2], [0.3, 0.4]]", "holds 2 rows (shape (2, 2)): several releases"),
        ("two.pt", _save_pt(torch.zeros(2, 2)), "holds 2 rows (shape (2, 2)): several releases"),
        ("two.csv", "0.1,0.2\n0.3,0.4\n", "holds 2 rows: several releases"),
        ("header.csv", "y0,y1\n0.1,0.2\n", "one row of numbers, without a header; got 'y0,y1'"),
        ("utf16.csv", "0.62,1.87\n".encode("utf-16"), "is not UTF-8 text"),
        ("utf16le.csv", "0.62,1.87\n".encode("utf-16-le"), "is not UTF-8 text"),
        ("gap.csv", "0.1,,0.2\n", "an empty field between commas in '0.1,,0.2'"),
    ],
)
def test_a_release_file_that_is_not_one_release_is_refused_in_one_line(tmp_path, name, content, message):
    path = tmp_path / name
    if callable(content):
        content(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ValueError) as error:
        cli.read_release(path=path)
    text = str(error.value)
    assert message in text and f"release file {path}" in text and "\n" not in text
    assert "weights_only" not in text and "allow_pickle" not in text  # no advice to load a file unsafely
    if "several releases" in message:
        assert "--releases FILE.csv" in text


def test_a_bad_release_file_stops_dpsbi_sample_in_one_line_before_loading(tmp_path):
    """The release is read before the posterior: an empty stand-in posterior file is never opened."""
    (tmp_path / "posterior.pt").write_bytes(b"")
    (tmp_path / "release.json").write_text('{"mean": 0.62, "x": 1.87}')
    with pytest.raises(SystemExit) as error:
        cli.sample([str(tmp_path / "posterior.pt"), "--release-file", str(tmp_path / "release.json")])
    assert str(error.value).startswith(f"dpsbi-sample: error: release file {tmp_path / 'release.json'} holds")


@pytest.mark.parametrize(
    "name, content",
    [
        ("bom.csv", "\ufeff0.62,1.87\n"),
        ("bom.json", "\ufeff[0.62, 1.87]"),
        ("spaced.txt", "0.62 1.87\n\n"),
        ("row.json", "[[0.62, 1.87]]"),
        ("row.npy", _save_npy([[0.62, 1.87]])),
        ("row.pt", _save_pt(torch.tensor([[0.62, 1.87]]))),
        ("list.pt", _save_pt([0.62, 1.87])),
        ("column.txt", "0.62\n1.87\n"),  # np.savetxt of a 1-D array
        ("column.npy", _save_npy([[0.62], [1.87]])),
    ],
)
def test_one_release_in_a_file_is_read(tmp_path, name, content):
    """A UTF-8 byte-order mark, blank lines, a ``(1, d)`` or ``(d, 1)`` array and a number a line are one
    release."""
    path = tmp_path / name
    content(path) if callable(content) else path.write_text(content, encoding="utf-8")
    torch.testing.assert_close(cli.read_release(path=path), torch.tensor([[0.62, 1.87]]))


def test_an_inline_release_with_an_empty_field_is_refused():
    for text in ("0.1, 0.2", "0.1 0.2", "0.1,0.2\n", "-0.4, 2.9"):
        assert cli.read_release(text).shape == (1, 2)
    for text in ("0.1,,0.2", "0.1,0.2,", ",0.1,0.2"):  # a field left empty: a number lost, not skipped
        with pytest.raises(ValueError, match="--release: an empty field between commas"):
            cli.read_release(text)


def test_a_custom_factory_error_gives_no_task_y_obs_hint(tmp_path, monkeypatch):
    """A custom task's config has no ``y_obs`` key (its release comes from the factory): dpsbi-run's hint to set
    ``task.y_obs`` would fail in Hydra. A built-in task's release error keeps the hint."""
    from dpsbi.experiment import ConfigError
    from dpsbi.experiment.config import build_task

    (tmp_path / "nope_model.py").write_text(NAMED_MODEL)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as error:
        build_task({"name": "custom", "factory": "nope_model:nope", "epsilon": None})
    assert "has no function 'nope'" in str(error.value) and "y_obs" not in str(error.value)
    (tmp_path / "unobserved.py").write_text(NAMED_MODEL.replace("task.y_obs,", "None,"))
    with pytest.raises(ConfigError) as error:
        build_task({"name": "custom", "factory": "unobserved:make_task", "epsilon": None})
    assert "returned a task with no observed release: give its y_obs" in str(error.value)
    assert "task.y_obs" not in str(error.value)
    with pytest.raises(ConfigError, match=r"task\.y_obs=simulate or task\.y_obs=\[\.\.\.\]"):
        build_task({"name": "conjugate_gaussian", "y_obs": [1.0]})
