"""Where a default fit's training seconds go, round by round: ``python scripts/fit_phases.py --task regression
--epsilon 1 --method sple --rounds 3 --compile true --out OUT.jsonl`` (one torch thread).

Fits the estimator at its defaults (``--rounds`` of them; ``--compile`` sets ``training.compile``) and writes a row
a round: the round's wall seconds and steps, and the CPU seconds of its phases: ``simulate`` (the round's
simulations and proposal draws), within it ``truncated`` (a truncated proposal's draws) and within that
``threshold`` (the density threshold's posterior draws and densities), ``fit_flow`` (training), within it
``train_epoch`` (the gradient steps), ``validation`` (the validation losses), ``checks`` (a compiled round's
gradient checks, its compile included: the first check compiles) and ``backward`` (every loss and backward pass,
checks included). ``--check-every-epoch`` checks the compiled gradient at every epoch's first full batch, the
cadence before the forty-fourth session (``COMPILED_CHECK_STEPS``), to price it. Set ``TORCHINDUCTOR_CACHE_DIR`` to
choose torch's compile cache.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

import dpsbi
import dpsbi.inference.estimator as estimator_module
import dpsbi.inference.sppe as sppe_module
import dpsbi.inference.training as training
import dpsbi.inference.truncation as truncation
from dpsbi.experiment.config import build_task

#: ``{phase: (owner, attribute)}``: the functions whose CPU seconds a row reports.
PHASES = {
    "simulate": (estimator_module.SequentialEstimator, "_simulate"),
    "truncated": (sppe_module, "truncated_prior_draws"),
    "threshold": (truncation, "density_threshold"),
    "fit_flow": (estimator_module, "fit_flow"),
    "train_epoch": (training._Round, "train_epoch"),
    "validation": (training._Round, "validation_loss"),
    "checks": (training._Round, "_checked_step"),
    "backward": (training._Round, "_backward"),
}


def clocked(clock: collections.Counter) -> None:
    """Wraps each function of :data:`PHASES` to add its CPU seconds to ``clock[phase]``."""
    for phase, (owner, name) in PHASES.items():
        inner = getattr(owner, name)

        def timed(*args: object, _inner: Callable = inner, _phase: str = phase, **kwargs: object) -> object:
            began = time.process_time()
            try:
                return _inner(*args, **kwargs)
            finally:
                clock[_phase] += time.process_time() - began

        setattr(owner, name, timed)


def check_every_epoch() -> None:
    """A compiled round checks its gradient at every epoch's first full batch (the cadence before), and, in epochs of
    more than ``COMPILED_CHECK_STEPS`` steps, also where the cadence now checks (none in the fits measured: at most
    66 steps an epoch)."""
    epoch = training._Round.train_epoch

    def train_epoch(
        self: training._Round, data: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.next_check = 0
        return epoch(self, data)

    training._Round.train_epoch = train_epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="regression")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--method", choices=("sppe", "sple"), default="sple")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", choices=("true", "false", "auto"), default="auto")
    parser.add_argument("--check-every-epoch", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.check_every_epoch:
        check_every_epoch()
    clock: collections.Counter = collections.Counter()
    clocked(clock)
    task = build_task({"name": args.task, "epsilon": args.epsilon})
    compile_setting = {"true": True, "false": False, "auto": "auto"}[args.compile]
    fitted = (dpsbi.SPPE if args.method == "sppe" else dpsbi.SPLE)(
        task, seed=args.seed, progress=False, rounds=args.rounds, training=dict(compile=compile_setting)
    )
    before: dict = {}

    def on_round(index: int, posterior: object, num_simulations: int) -> None:
        nonlocal before
        entry = fitted.history[-1]
        row = {
            "task": args.task,
            "epsilon": args.epsilon,
            "method": args.method,
            "compile": args.compile,
            "check_every_epoch": args.check_every_epoch,
            "seed": args.seed,
            "round": index,
            "round_s": round(entry["seconds"], 2),
            "steps": entry["steps"],
            **{phase: round(clock[phase] - before.get(phase, 0.0), 2) for phase in PHASES},
            "torch": torch.__version__,
        }
        before = dict(clock)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    fitted.on_round_end = on_round
    fitted.run()


if __name__ == "__main__":
    main()
