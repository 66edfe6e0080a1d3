"""scripts/main_grid.py: the main table's mean and spread over seeds, and when each run first reached the bar."""

import json

import main_grid  # scripts/ is on the tests' path (pyproject.toml)


def row(method: str, seed: int, c2st: float, cpu: float, at_bar: float | None) -> dict:
    return dict(
        task="regression",
        epsilon=1.0,
        method=method,
        seed=seed,
        c2st=c2st,
        mmd=0.01 * (seed + 1),
        cpu_time=cpu,
        wall_time=2 * cpu,
        num_simulations=10000,
        cpu_at_bar=at_bar,
    )


def test_first_at_bar_is_the_cpu_time_of_the_first_round_at_or_below_0_55():
    rounds = [dict(c2st=0.7, cpu_time=10.0), dict(c2st=0.55, cpu_time=20.0), dict(c2st=0.5, cpu_time=30.0)]
    assert main_grid.first_at_bar(rounds) == 20.0
    assert main_grid.first_at_bar(rounds[:1]) is None


def test_table_gives_mean_and_sd_over_seeds_and_how_many_reached_the_bar(tmp_path):
    rows = [
        row("sple", 0, 0.52, 100.0, 50.0),
        row("sppe", 1, 0.54, 300.0, 200.0),
        row("sppe", 0, 0.50, 100.0, 100.0),
        row("sppe", 2, 0.58, 200.0, None),
    ]
    lines = main_grid.table(rows).splitlines()
    sppe, sple = (line.strip("|").split("|") for line in lines[2:4])  # SPPE before SPLE, as in METHODS
    assert [c.strip() for c in sppe[2:5]] == ["sppe", "0, 1, 2", "0.540 ± 0.040"]
    assert [c.strip() for c in sppe[6:]] == ["200", "400", "10000", "2 of 3 (150)"]
    assert [c.strip() for c in sple[3:5]] == ["0", "0.520"] and sple[-1].strip() == "1 of 1 (50)"
    assert "sd ratio" not in lines[0]  # runs from before sd_ratio was recorded: no column
    rows[1:3] = [{**rows[1], "sd_ratio": 1.3}, {**rows[2], "sd_ratio": 1.1}]
    ratios = main_grid.table(rows).splitlines()
    assert (
        ratios[0].endswith(" sd ratio |")
        and ratios[2].endswith(" | 1.20 ± 0.14 |")
        and ratios[3].endswith(" - |")
    )
    main_grid.plot(rows, tmp_path / "grid.png")
    assert (tmp_path / "grid.png").stat().st_size > 1000


def test_spread_of_one_value_is_the_value():
    assert main_grid.spread([0.5], ".3f") == "0.500"
    assert main_grid.spread([1.0, 3.0], ".1f") == "2.0 ± 1.4"  # sd with n - 1: sqrt(2)


def test_collect_keeps_one_row_per_cell_whichever_sweep_ran_it(tmp_path, monkeypatch):
    """A cell rerun into another sweep directory (a grid resumed on a new machine) replaces its old row."""
    path = tmp_path / "rows.jsonl"
    old = {**row("sppe", 0, 0.60, 100.0, None), "run": "grid/regression_seed0_eps1/0_regression_eps1_sppe"}
    path.write_text(json.dumps(old) + "\n")
    rerun = {**row("sppe", 0, 0.52, 90.0, 40.0), "run": "grid/regression_seed0/4_regression_eps1_sppe"}
    other = {**row("sppe", 1, 0.53, 95.0, 45.0), "run": "grid/regression_seed1/4_regression_eps1_sppe"}
    monkeypatch.setattr(main_grid, "run_rows", lambda sweep: [rerun, other])
    main_grid.collect([tmp_path / "grid"], path)
    rows = main_grid.read_jsonl(path)
    assert [(r["seed"], r["c2st"], r["run"]) for r in rows] == [
        (0, 0.52, rerun["run"]),
        (1, 0.53, other["run"]),
    ]
