"""scripts/main_grid.py: the main table's mean and spread over seeds, and when each run first reached the bar."""

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
    main_grid.plot(rows, tmp_path / "grid.png")
    assert (tmp_path / "grid.png").stat().st_size > 1000


def test_spread_of_one_value_is_the_value():
    assert main_grid.spread([0.5], ".3f") == "0.500"
    assert main_grid.spread([1.0, 3.0], ".1f") == "2.0 ± 1.4"  # sd with n - 1: sqrt(2)
