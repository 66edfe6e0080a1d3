"""Where torch's CPU compiler (inductor, torch 2.13) gets the spline's gradients wrong: ``OMP_NUM_THREADS=1
python scripts/archive/compiled_gradients.py``.

The widths' part of zuko's rational-quadratic spline (squashed, softmax, running sum), piece by piece: each
function's gradient compiled (``torch.compile``, inductor, and ``aot_eager``, torch's graph run without inductor's
code) against eager, as the relative norm of the difference. Printed one line a case. The last two cases: dpsbi's
running sum (``running_sum``, a cumsum down columns), and the same sums as a product with a triangular matrix of ones
(another summation order, so not bit for bit the eager cumsum's); then the whole one-hot spline with each. RESULTS,
"Compiled on the CPU: faster, and wrong"; the whole spline's check is ``tests/test_training_step.py``.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
torch.manual_seed(0)
W, R, L = torch.randn(512, 8, 10), torch.randn(512, 8, 10), math.log(1e-3)


def squash(w):
    return w / (1 + abs(2 * w / L))  # zuko's bound on the unconstrained widths (slope 1e-3)


CASES = {
    "squash": lambda w: (squash(w) * R).sum(),
    "softmax": lambda w: (F.softmax(w, -1) * R).sum(),
    "cumsum": lambda w: (w.cumsum(-1) * R).sum(),
    "squash, softmax": lambda w: (F.softmax(squash(w), -1) * R).sum(),
    "squash, cumsum": lambda w: (squash(w).cumsum(-1) * R).sum(),
    "softmax, cumsum": lambda w: (F.softmax(w, -1).cumsum(-1) * R).sum(),
    "squash, softmax, cumsum": lambda w: (F.softmax(squash(w), -1).cumsum(-1) * R).sum(),
    "squash, softmax, running sum down columns": lambda w: (
        F.softmax(squash(w), -1).movedim(-1, 0).cumsum(0).movedim(0, -1) * R
    ).sum(),
    "squash, softmax, running sum as a triangular product": lambda w: (
        F.softmax(squash(w), -1) @ torch.triu(torch.ones(10, 10)) * R
    ).sum(),
}


def gradient(f, w):
    w = w.clone().requires_grad_(True)
    f(w).backward()
    return w.grad


for name, f in CASES.items():
    eager = gradient(f, W)
    errors = []
    for backend in ("inductor", "aot_eager"):
        torch._dynamo.reset()
        compiled = gradient(torch.compile(f, fullgraph=True, dynamic=False, backend=backend), W)
        errors.append(f"{backend} {float((compiled - eager).norm() / eager.norm()):.2e}")
    print(f"{name}: {', '.join(errors)}", flush=True)


def running_sum_compiling_as_product(x):
    """dpsbi's ``running_sum``, but a product with a triangular matrix of ones while ``torch.compile`` traces."""
    if torch.compiler.is_compiling():
        return x @ torch.triu(torch.ones(x.shape[-1], x.shape[-1], dtype=x.dtype, device=x.device))
    return x.movedim(-1, 0).cumsum(0).movedim(0, -1)


def spline_gradients() -> None:
    """The whole one-hot spline (the case of ``tests/test_training_step.py``) compiled against eager, with dpsbi's
    ``running_sum`` and with :func:`running_sum_compiling_as_product` in its place."""
    from dpsbi.inference import spline_flow

    generator = torch.Generator().manual_seed(0)
    params = [torch.randn(512, 8, k, generator=generator) for k in (10, 10, 9)]
    x = torch.randn(512, 8, generator=generator) * 3

    def objective(widths, heights, derivatives):
        y, ladj = spline_flow.OneHotRQSTransform(widths, heights, derivatives, bound=5.0).call_and_ladj(x)
        return y.sin().mean() + ladj.mean()

    for label, running in (
        ("cumsum", spline_flow.running_sum),
        ("product", running_sum_compiling_as_product),
    ):
        spline_flow.running_sum = running
        torch._dynamo.reset()
        grads = []
        for run in (objective, torch.compile(objective, fullgraph=True, dynamic=False)):
            leaves = [p.clone().requires_grad_(True) for p in params]
            grads.append(torch.autograd.grad(run(*leaves), leaves))
        errors = [f"{float((b - a).norm() / a.norm()):.1e}" for a, b in zip(*grads, strict=True)]
        print(
            f"one-hot spline, running sum by {label}: widths, heights, derivatives {', '.join(errors)}",
            flush=True,
        )


spline_gradients()
