"""scripts/frontier.py at a tiny budget: rows per round from the library's round callback, the last one
marked, a finished configuration skipped when run again, and the report table."""

import json

import frontier  # scripts/ is on the tests' path (pyproject.toml)


def test_frontier_rows_come_from_the_round_callback_and_end_marked(tmp_path, capsys):
    out = tmp_path / "frontier.jsonl"
    command = [
        "run",
        "--task",
        "conjugate_gaussian",
        "--epsilon",
        "1",
        "--method",
        "sppe",
        "--configs",
        "1:mc",
    ]
    command += ["--rounds", "2", "--sims-per-round", "100", "--max-epochs", "1", "--out", str(out)]
    frontier.main(command)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2] and [r["last"] for r in rows] == [False, True]
    assert rows[1]["num_simulations"] == 200 and rows[1]["seconds"] > rows[0]["seconds"] > 0
    assert all(0.0 <= r["c2st"] <= 1.0 for r in rows)
    frontier.main(command)  # complete: skipped
    assert len(out.read_text().splitlines()) == 2
    capsys.readouterr()
    frontier.main(["report", str(out)])
    assert "conjugate_gaussian" in capsys.readouterr().out
