"""Importing dpsbi, and touching the parts it loads lazily, leaves the process's global state as it was."""

import json
import os
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import json, warnings
    import torch

    def state():
        return {
            "validate": torch.distributions.Distribution._validate_args,
            "dtype": str(torch.get_default_dtype()),
            "threads": torch.get_num_threads(),
            "grad": torch.is_grad_enabled(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "matmul": torch.get_float32_matmul_precision(),
        }

    before = state()
    import dpsbi
    for name in ["SPPE", "SPLE", "NaiveNPE", "load_posterior", "baselines", "metrics", "simulators"]:
        getattr(dpsbi, name)
    import dpsbi.diagnostics, dpsbi.experiment, dpsbi.inference.flows
    try:
        torch.distributions.Normal(0.0, -1.0)
        raises = False
    except ValueError:
        raises = True
    ours = [str(f) for f in warnings.filters if "nflows" in str(f) or "triangular_solve" in str(f)]
    print(json.dumps({"before": before, "after": state(), "raises": raises, "ours": ours}))
    """
)


def test_importing_dpsbi_changes_no_global_state():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["raises"], "Normal(0., -1.) no longer raises: distribution validation was switched off"
    assert result["after"] == result["before"]
    assert result["ours"] == []  # dpsbi's own warning filters are scoped to its calls
