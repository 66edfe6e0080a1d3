"""A default fit keeps the terminal readable: one progress bar over rounds and nothing else."""

import subprocess
import sys

SCRIPT = """
import torch
import dpsbi
torch.set_num_threads(1)  # small flows; two threads on a shared, busy machine wait on each other (20x slower)
task = dpsbi.tasks.load("conjugate_gaussian", epsilon=1.0)
posterior = dpsbi.SPPE(task, rounds=2, sims_per_round=200, training=dict(max_steps=20)).run()
posterior.sample((100,), seed=0)
posterior = dpsbi.SPLE(task, rounds=2, sims_per_round=200, training=dict(max_steps=20)).run()
posterior.sample((100,), seed=0)
"""


def test_a_default_two_round_fit_prints_one_bar_and_no_warning():
    done = subprocess.run([sys.executable, "-W", "default", "-c", SCRIPT], capture_output=True, timeout=600)
    # bytes, not text=True: universal newlines would turn tqdm's "\r" redraws into lines
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 0, output
    lines = [line for line in output.replace("\r", "\n").splitlines() if line.strip()]
    assert "Warning" not in output and "warn" not in output.lower(), output
    for noise in ("GPU available", "litlogger", "Epoch", "Sanity", "LOCAL_RANK"):
        assert noise not in output, noise
    # tqdm redraws one line per update ("\r"): what a terminal keeps is one line per bar
    assert output.count("\n") <= 40, output
    assert all(line.lstrip().startswith(("SPPE rounds", "SPLE rounds")) for line in lines), lines
