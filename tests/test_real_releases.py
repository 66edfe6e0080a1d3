"""docs/REAL_RELEASES.md runs as written: every ```python block, in order, in a fresh directory (a block
starting ``# file: NAME`` is written to NAME; the others run in their own process). The page's release is
made by OpenDP, clamped at 0, and its SPPE and SPLE posteriors are scored against the exact one."""

import re
from pathlib import Path

import pytest
from docs_runner import blocks, run_block

ROOT = Path(__file__).parents[1]

pytest.importorskip("opendp")


def test_the_real_releases_page_runs_as_written(tmp_path):
    outputs = [
        run_block(language, code, tmp_path) for language, code in blocks(ROOT / "docs" / "REAL_RELEASES.md")
    ]
    text = "\n".join(outputs)
    # OpenDP's release: eight nonnegative integer counts
    (fresh,) = re.findall(r"a release made just now: +\[([^\]]*)\]", text)
    assert all(int(v) >= 0 for v in fresh.split(",")) and len(fresh.split(",")) == 8, text
    # dpsbi's clamped mechanism is the one OpenDP ran: its probabilities sum to 1 and match OpenDP's frequencies
    (deviation,) = re.findall(r"in standard errors: ([0-9.]+)", text)
    assert float(deviation) < 5.5, text
    # the quadrature posterior agrees with dpsbi's exact rejection ABC
    (quadrature, abc) = map(
        float, re.search(r"quadrature (-[0-9.]+) rejection ABC (-[0-9.]+)", text).groups()
    )
    assert abs(quadrature - abc) < 0.3, text
    assert float(re.search(r"C2ST quadrature vs rejection ABC ([0-9.]+)", text).group(1)) <= 0.6, text
    # SPPE and SPLE near the exact posterior at the page's small budgets
    scores = [float(v) for v in re.findall(r"C2ST vs exact ([0-9.]+)", text)]
    assert len(scores) == 2 and max(scores) <= 0.65, text
    # every claimed refusal happened, one line each
    refusals = re.findall(r"^(.*?): refused: (.*)$", text, re.M)
    assert len(refusals) == 7 + 8 + 1, text
    assert "SPLE accepts a user step declared" in text
