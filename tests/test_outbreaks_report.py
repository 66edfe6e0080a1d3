"""scripts/outbreaks.py: the R0 table and the three figures of docs/RESULTS.md from a sweep directory."""

from pathlib import Path

import outbreaks  # scripts/ is on the tests' path (pyproject.toml)
import torch
from omegaconf import OmegaConf


def fake_run(root: Path, name: str, method: str, log_beta: float, log_gamma: float) -> None:
    """A finished run's config.yaml and final draws around (log_beta, log_gamma)."""
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
    draws = torch.tensor([log_beta, log_gamma]) + 0.05 * torch.randn(
        400, 2, generator=torch.Generator().manual_seed(0)
    )
    lines = ["log_beta,log_gamma"] + [f"{a:.6f},{b:.6f}" for a, b in draws.tolist()]
    (run / method / "samples.csv").write_text("\n".join(lines) + "\n")


def test_report_gives_the_r0_table_and_figures(tmp_path, capsys):
    fake_run(tmp_path, "sir_ebola_guinea", "sppe", -1.0, -1.5)  # R0 = e^0.5 = 1.65: inside 1.44-2.01
    fake_run(tmp_path, "sir_influenza", "sple", -1.0, -3.0)  # R0 = e^2 = 7.4: outside 3-4.5
    outbreaks.main([str(tmp_path), "-o", str(tmp_path / "fig" / "outbreaks")])
    table = capsys.readouterr().out
    assert "| Ebola, Guinea | sppe | 1.6" in table and table.split("Ebola, Guinea")[1].split("\n")[
        0
    ].endswith("| yes |")
    assert "| influenza, boarding school | sple | 7." in table and table.split("boarding school | sple")[
        1
    ].split("\n")[0].endswith("| no |")
    for suffix in ("posteriors", "r0", "predictive"):
        assert (tmp_path / "fig" / f"outbreaks_{suffix}.png").stat().st_size > 1000
