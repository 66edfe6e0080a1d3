"""docs/REAL_RELEASES.md runs as written: every ```python block, in order, in a fresh directory (a block
starting ``# file: NAME`` is written to NAME; the others run in their own process). The page's release is
made by OpenDP, clamped at 0, and its SPPE and SPLE posteriors are scored against the exact one; a DP mean
composed by OpenDP (noisy sum and count) is accounted for as OpenDP does and fitted against exact rejection ABC;
two census-style tables with the invariant total are fitted alone and jointly with their exact likelihood."""

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
    # the DP mean: dpsbi's total epsilon of the composition is OpenDP's map of it
    dpsbi_epsilon, opendp_epsilon = map(
        float, re.search(r"dpsbi epsilon = ([0-9.]+) .*composition: ([0-9.]+)", text).groups()
    )
    assert abs(dpsbi_epsilon - opendp_epsilon) < 1e-8 and abs(dpsbi_epsilon - 1) < 1e-6, text
    # SPPE near the exact posterior at the page's budget (1000 draws a side: C2ST sd ~0.01); sd, nearly its
    # prior, within 4 standard errors of its spread (1 / sqrt(2 x 1000) each)
    c2st, _, sd_ratio = map(
        float,
        re.search(r"DP mean: C2ST ([0-9.]+) sd ratio \(mean, sd\) \[([0-9.]+), ([0-9.]+)\]", text).groups(),
    )
    assert c2st <= 0.62 and abs(sd_ratio - 1) < 4 * 0.032, text
    # two tables: the page's likelihood is census_table's with table B left out; the joint posterior is narrower
    # than table A's on every parameter and than table B's on the age parameters (ESS ~750 each: a ratio of
    # two such sds has a standard error of about 0.037)
    assert float(re.search(r"largest \|difference\| ([0-9.e+-]+)", text).group(1)) < 1e-8, text
    rho = re.search(r"privacy: rho = 0.099 \+ 0.05 = ([0-9.]+) zCDP", text)
    assert rho and float(rho.group(1)) == 0.149, text
    to_a, to_b = (
        [float(v) for v in re.search(rf"joint sd / table {t} sd: \[([^\]]*)\]", text).group(1).split()]
        for t in "AB"
    )
    assert max(to_a) < 0.9 and max(to_b[:2]) < 1.0 and to_b[2] < 1.1, text
