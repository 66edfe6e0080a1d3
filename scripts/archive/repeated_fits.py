"""Five amortized fits of one seed in one process (regression over epsilon 0.1-10, 2 rounds of 2000 simulations,
100 steps a round, one torch thread): is each fit's flow the first one's, bit for bit? Printed, one line a fit:
equal or not, and the largest difference of a parameter (docs/RESULTS.md, "The discrete Gaussian's quantile and
census tables' amortized fit"). Run it with the tree's ``PYTHONPATH`` to compare two versions.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/repeated_fits.py
"""

import torch

import dpsbi

torch.set_num_threads(1)
task = dpsbi.tasks.load("regression", epsilon=1.0)
first = None
for fit in range(5):
    estimator = dpsbi.SPPE(
        task,
        rounds=2,
        sims_per_round=2000,
        amortized=True,
        epsilon_range=(0.1, 10.0),
        training=dict(max_steps=100, accelerator="cpu"),
        progress=False,
        seed=0,
    )
    estimator.run()
    state = {name: value.clone() for name, value in estimator.flow.state_dict().items()}
    first = first or state
    same = all(torch.equal(first[name], state[name]) for name in first)
    largest = max(
        float((first[k].double() - state[k].double()).abs().max())
        for k in first
        if state[k].is_floating_point()
    )
    print(f"fit {fit}: equal to the first {same}, largest difference {largest:.3g}", flush=True)
