"""scripts/outbreaks.py: the R0 table and the three figures of docs/RESULTS.md from a sweep directory, and the
deterministic SIR's least-squares R0."""

import json
import math
from pathlib import Path

import numpy as np
import outbreaks  # scripts/ is on the tests' path (pyproject.toml)
import pytest
import torch
from omegaconf import OmegaConf

from dpsbi.tasks.sir import TIMES


def draws_csv(path: Path, log_beta: float, log_gamma: float) -> None:
    """400 draws around (log_beta, log_gamma), sd 0.05, as a draws CSV."""
    draws = torch.tensor([log_beta, log_gamma]) + 0.05 * torch.randn(
        400, 2, generator=torch.Generator().manual_seed(0)
    )
    lines = ["log_beta,log_gamma"] + [f"{a:.6f},{b:.6f}" for a, b in draws.tolist()]
    path.write_text("\n".join(lines) + "\n")


def fake_run(
    root: Path, name: str, method: str, log_beta: float, log_gamma: float, scored: float | None = None
) -> None:
    """A finished run's config.yaml and final draws around (log_beta, log_gamma); ``scored``: the run also has a
    reference (around (-1, -1.5): R0 1.65) and this C2ST against it in its last round."""
    run = root / f"0_{name}_{method}"
    (run / method).mkdir(parents=True)
    task = {
        "name": name,
        "epsilon": None,
        "y_obs": None,
        "seed": 0,
        "population": 100000,
        "trials": 100,
        "pseudo_count": 100.0,
        "simulator": "exact",
    }
    OmegaConf.save(OmegaConf.create({"task": task, "method": {"name": method}}), run / "config.yaml")
    draws_csv(run / method / "samples.csv", log_beta, log_gamma)
    if scored is not None:
        draws_csv(run / "reference.csv", -1.0, -1.5)
        rounds = [{"round": 1, "c2st": 0.9}, {"round": 2, "c2st": scored}]
        (run / method / "rounds.json").write_text(json.dumps(rounds))


def row(table: str, prefix: str) -> list[str]:
    """The cells of the table's row that starts with ``| prefix``."""
    line = next(line for line in table.splitlines() if line.startswith(f"| {prefix}"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_report_says_whether_the_published_point_lies_inside_the_interval(tmp_path, capsys):
    # R0 = e^0.5 = 1.65 with a 95 % interval of about 1.5-1.8: Guinea's published 1.71 inside, its range overlapping
    fake_run(tmp_path, "sir_ebola_guinea", "sppe", -1.0, -1.5)
    # R0 = e^0.25 = 1.28 (1.13-1.49): overlaps nothing of Liberia's 1.72-1.94, point outside
    fake_run(tmp_path, "sir_ebola_liberia", "sppe", -1.0, -1.25, scored=0.5123)
    outbreaks.main(["report", str(tmp_path), "-o", str(tmp_path / "fig" / "outbreaks")])
    table = capsys.readouterr().out
    guinea, liberia = row(table, "Ebola, Guinea"), row(table, "Ebola, Liberia")
    assert guinea[1:3] == ["sppe", "1.65"] and guinea[4:6] == ["1.71 (1.44-2.01)", "yes"]
    assert liberia[2] == "1.28" and liberia[5] == "no"
    assert guinea[6].startswith("1.53 (i0 1e-05)")  # the deterministic fit at the run's K = 10^5
    assert guinea[7:9] == ["-", "-"]  # no reference
    # the reference's R0 (its draws: Guinea's run's, so the same summary) and the last round's C2ST against it
    assert liberia[7:9] == [f"{guinea[2]} ({guinea[3]})", "0.512"] and liberia[3] == "1.13-1.49"
    assert "with the exception of the flu outbreak" in table  # the paper's own reading beside the table
    for suffix in ("posteriors", "r0", "predictive"):
        assert (tmp_path / "fig" / f"outbreaks_{suffix}.png").stat().st_size > 1000


@pytest.mark.parametrize("i0", [1e-5, 1e-3])
def test_least_squares_recovers_the_r0_of_a_deterministic_curve(i0):
    """A noiseless curve of the deterministic SIR (finer steps than the fit's) at R0 = e^1.5 = 4.48."""
    log_beta, log_gamma = -0.5, -2.0
    curve = outbreaks.deterministic_curves(np.array(log_beta), np.array(log_gamma), i0, TIMES, dt=0.005)
    r0, rss = outbreaks.least_squares_r0(curve.tolist(), i0)
    assert r0 == pytest.approx(math.exp(1.5), rel=1e-3) and rss < 1e-8
