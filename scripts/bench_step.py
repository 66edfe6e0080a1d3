"""The training step as a fit runs it (``_Round.step``: draws, loss, backward, clipping, Adam, schedule), timed
on each device and flow backend at three sizes, with its device-to-host synchronizations counted on CUDA:
``python scripts/bench_step.py [--devices cpu cuda] [--backends dpsbi nflows] [--json out.jsonl]``.

SPPE's atomic step on regression at epsilon 1 (batch ``B``, ``M = 1`` release, 10 atoms: ``10 B`` flow
evaluations), at B = 100 (the default step), 1 000 and 10 000 (100 000 evaluations); with ``--step
sir_amortized`` SIR's amortized step instead (the plain loss over epsilon 0.1-10, one binomial-curve release a
row, ``B`` flow evaluations; B = 1000 is the amortized default); with ``--step census_amortized`` the census
table's (46 cells, discrete Gaussian noise over rho 0.15-0.7, one release a row); with ``--step
naive_bayes_sple_amortized`` SPLE's amortized step on naive Bayes (epsilon 1-10 around the stored release at 10,
the default ``M = 4`` widened releases a row: ``4 B`` evaluations; B = 1000 is the default); with ``--step
count_amortized`` a user's count released by a scalar discrete Gaussian, amortized over epsilon 0.2-1 (each row
re-calibrated by CKS Thm. 7). Eager, replayed as a
CUDA graph (``cuda_graph``, what a fit on CUDA runs by default), and compiled (``torch.compile``; ``--compile-on cpu`` for
the CPU too) with its compile time. Each row: the median over ``--repeats`` timed
steps after ``--warmup`` steps (CUDA synchronized around each), written to ``--json`` as it is measured. CPU
rows use one torch thread (the fits' default).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dpsbi
from dpsbi.inference.training import TrainingSettings, _deterministic, _Round, batches
from dpsbi.mechanisms import DiscreteGaussian

SIZES = (100, 1000, 10000)


def count_task(epsilon: float) -> dpsbi.tasks.Task:
    """A user's count (``s = round(theta)``, ``theta ~ U(0, 100)``) released by OpenDP's Gaussian on integers: a
    scalar discrete Gaussian at ``(epsilon, 1e-6)``, sensitivity 1 (no stored release)."""
    prior = dpsbi.tasks.box([0.0], [100.0])
    return dpsbi.tasks.from_simulator(
        prior, lambda theta: theta.round(), DiscreteGaussian(epsilon, 1e-6), None, name="count"
    )


#: The steps timed (``--step``): the task (a registered name, or a function of epsilon), its epsilon, the estimator
#: and its arguments beside the task.
STEPS = {
    "regression": ("regression", 1.0, dpsbi.SPPE, {}),
    "sir_amortized": ("sir", 1.0, dpsbi.SPPE, {"amortized": True, "epsilon_range": (0.1, 10.0)}),
    "census_amortized": (
        "census_table",
        4.6574,
        dpsbi.SPPE,
        {"amortized": True, "epsilon_range": (2.8818, 10.0343)},
    ),
    "naive_bayes_sple_amortized": (
        "naive_bayes",
        10.0,
        dpsbi.SPLE,
        {"amortized": True, "epsilon_range": (1.0, 10.0), "inner_samples": 4},
    ),
    "count_amortized": (count_task, 0.5, dpsbi.SPPE, {"amortized": True, "epsilon_range": (0.2, 1.0)}),
}


def _estimator(backend: str, batch: int, step: str = "regression") -> dpsbi.SPPE | dpsbi.SPLE:
    """``step``'s estimator on its task (:data:`STEPS`) with ``2 batch`` stored simulations and a flow built on
    them (one tiny round on the CPU), ready for its loss of the second round (SPPE's atomic on regression)."""
    name, epsilon, method, options = STEPS[step]
    estimator = method(
        name(epsilon) if callable(name) else dpsbi.tasks.load(name, epsilon=epsilon),
        rounds=1,
        sims_per_round=max(2 * batch, 200),
        flow=dict(backend=backend),
        training=dict(max_steps=1, accelerator="cpu"),
        progress=False,
        **options,
    )
    estimator.run()
    return estimator


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synchronizations(run) -> list[str]:
    """The messages of the device-to-host synchronizations ``run()`` makes on CUDA (torch's sync debug mode; its
    first call also warns that it is a prototype, which is no synchronization). The tests' zero-sync checks use it
    too (``tests/conftest.py``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return [
        str(w.message) for w in caught if "synchroniz" in str(w.message) and "prototype" not in str(w.message)
    ]


class OperatorCount(TorchDispatchMode):
    """The torch operators run inside it (``calls``): a GPU's kernels, counted on the CPU or torch's meta device.
    The tests' operator bounds use it too (``tests/conftest.py``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def kernels(run, device: torch.device, path: str, title: str, steps: int = 3) -> None:
    """Append to ``path`` the 25 operators that take the most time (on the GPU on CUDA, else on the host) over
    ``steps`` calls of ``run()``, under the heading ``title``: where a step's time goes."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            run()
        _sync(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    with open(path, "a") as f:
        f.write(f"## {title}, {steps} steps\n{prof.key_averages().table(sort_by=key, row_limit=25)}\n")


def measure(
    backend: str,
    device: str,
    batch: int,
    compiled: str | None,
    deterministic: bool,
    warmup: int,
    repeats: int,
    graph: bool = False,
    step: str = "regression",
    profile: str | None = None,
) -> dict:
    """One row: ms per step (median and min), steps timed, the first step's seconds (compiling, when compiled),
    synchronizations per step. ``compiled``: a ``torch.compile`` mode, or ``None``; ``graph``: the step replayed
    as a CUDA graph (else eager, when not compiled); ``deterministic``: under the deterministic kernels a fit on
    CUDA runs with (``_deterministic``); ``profile``: a file the eager step's most costly operators are appended
    to (:func:`kernels`)."""
    device = torch.device(device)
    estimator = _estimator(backend, batch, step)
    flow = estimator.flow.to(device)
    data = tuple(t.to(device) for t in estimator._dataset(False))
    settings = TrainingSettings(
        batch_size=batch,
        accelerator=device.type,
        compile=compiled is not None,
        cuda_graph=graph,
        max_steps=10_000,
    )
    state = _Round(flow, estimator.loss(1), settings, 0, 10_000, compile_mode=compiled)
    rows = next(batches(torch.arange(data[0].shape[0], device=device), batch))
    with _deterministic(device) if deterministic else contextlib.nullcontext():
        start = time.perf_counter()
        state.step(data, rows)  # the first step compiles or captures, and builds Adam's state
        _sync(device)
        first = time.perf_counter() - start
        for _ in range(warmup):
            state.step(data, rows)
        _sync(device)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            state.step(data, rows)
            _sync(device)
            times.append(time.perf_counter() - start)
        syncs = len(synchronizations(lambda: state.step(data, rows))) if device.type == "cuda" else None
        if profile and not graph and compiled is None:
            title = f"{backend} {device} batch {batch}{', deterministic' if deterministic else ''}"
            kernels(lambda: state.step(data, rows), device, profile, title)
    return {
        "step": step,
        "backend": backend,
        "device": device.type,
        "batch": batch,
        "flow_evaluations": batch * estimator.step_work(1) // estimator.training.batch_size,
        "compiled": compiled,
        "cuda_graph": graph,
        "deterministic": deterministic,
        "ms_median": 1000 * statistics.median(times),
        "ms_min": 1000 * min(times),
        "steps_timed": repeats,
        "first_step_s": first,
        "syncs_per_step": syncs,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--devices", nargs="+", default=["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    )
    parser.add_argument("--backends", nargs="+", default=["dpsbi", "nflows"])
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    parser.add_argument("--step", choices=list(STEPS), default="regression", help="the step timed")
    parser.add_argument(
        "--compile-on",
        nargs="*",
        default=["cuda"],
        help="devices whose dpsbi rows are also compiled (cuda, cpu)",
    )
    parser.add_argument(
        "--compile-modes", nargs="*", default=["default"], help="torch.compile modes of those rows"
    )
    parser.add_argument(
        "--deterministic", action="store_true", help="also eager CUDA rows, deterministic kernels"
    )
    parser.add_argument(
        "--graph",
        action="store_true",
        help="also CUDA rows replayed as a CUDA graph (and, with --deterministic, under deterministic kernels)",
    )
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", help="append each row to this JSON-lines file as it is measured")
    parser.add_argument("--profile", help="append each eager row's costliest operators to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cuda = [d for d in args.devices if d == "cuda"]
    # what a fit on CUDA runs first (replayed, then compiled), the eager rows (profiled: slow) after, so that a
    # run cut short by its time limit (scripts/cuda_check.sh) has the rows issue 30's targets read
    plan = [
        (d, "dpsbi", n, None, det, True)
        for d in (cuda if args.graph else [])
        for det in (False, True)[: 1 + args.deterministic]
        for n in args.sizes
    ]
    plan += [
        (d, "dpsbi", n, mode, False, False)
        for d in args.devices
        if d in args.compile_on
        for mode in args.compile_modes
        for n in args.sizes
    ]
    plan += [(d, b, n, None, False, False) for d in args.devices for b in args.backends for n in args.sizes]
    if args.deterministic:
        plan += [(d, "dpsbi", n, None, True, False) for d in cuda for n in args.sizes]
    out = []
    for device, backend, batch, compiled, deterministic, graph in plan:
        row = measure(
            backend,
            device,
            batch,
            compiled,
            deterministic,
            args.warmup,
            args.repeats,
            graph,
            args.step,
            args.profile,
        )
        print(json.dumps(row), flush=True)
        out.append(row)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    return out


if __name__ == "__main__":
    main()
