"""Why a compiled training step's gradient can be off eager's on one batch with no compiler bug: a rational-quadratic
spline is C1, its second derivative is not, so the log-determinant's gradient jumps at the knots, and a value on (or
within a few ulps of) a knot has two gradients, one per bin; eager and compiled code round the knots differently in
their last bits, so such a value can land in different bins. From random spline parameters, values on eager's knots:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/archive/knot_gradients.py

The thirty-seventh session's figures (docs/RESULTS.md, "The compiler's second bug was a spline knot"): eager on a
knot against one ulp right of it 1.71 relative difference; inductor against eager mid-bin 8.3e-6, on eager's knots
1.16; aot_eager on the knots 0.693; 589 of 2000 knots rounded differently by the compiling form than by cumsum.
"""

import warnings

import torch

from dpsbi.inference.spline_flow import OneHotRQSTransform

ROWS, BINS = 2000, 10


def log_det_sum(widths, heights, slopes, x):
    """The spline's values plus log-determinants, summed: a loss whose gradient holds the log-determinant's."""
    y, ladj = OneHotRQSTransform(widths, heights, slopes, bound=5.0).call_and_ladj(x)
    return (y + ladj).sum()


def gradient(function, parameters, x):
    """``function``'s gradient in the spline's parameters at ``x``, flattened."""
    leaves = [t.clone().requires_grad_() for t in parameters]
    function(*leaves, x).backward()
    return torch.cat([t.grad.flatten() for t in leaves])


def relative(a, b):
    return float((a - b).norm() / b.norm())


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    parameters = (torch.randn(ROWS, BINS), torch.randn(ROWS, BINS), torch.randn(ROWS, BINS - 1))
    with torch.no_grad():
        knots = OneHotRQSTransform(*parameters, bound=5.0).horizontal  # eager's knots (a cumulative sum)
    on = knots[:, 5].clone()  # each row's value exactly on its sixth knot
    right = torch.nextafter(on, torch.full_like(on, 10.0))  # one ulp right of it
    middle = (knots[:, 5] + knots[:, 6]) / 2
    eager_on = gradient(log_det_sum, parameters, on)
    print(
        f"eager, on the knot against one ulp right of it: {relative(gradient(log_det_sum, parameters, right), eager_on):.3g}"
    )
    compiled = torch.compile(log_det_sum, fullgraph=True, dynamic=False)
    for name, x in (("mid-bin", middle), ("on eager's knots", on)):
        eager = gradient(log_det_sum, parameters, x)
        print(
            f"inductor against eager, values {name}: {relative(gradient(compiled, parameters, x), eager):.3g}"
        )
    torch._dynamo.reset()
    aot = torch.compile(log_det_sum, fullgraph=True, dynamic=False, backend="aot_eager")
    print(
        f"aot_eager against eager, values on eager's knots: {relative(gradient(aot, parameters, on), eager_on):.3g}"
    )
    compiling = torch.compiler.is_compiling
    torch.compiler.is_compiling = lambda: (
        True
    )  # running_sum's compiling form (a product with triangular ones)
    try:
        with torch.no_grad():
            product = OneHotRQSTransform(*parameters, bound=5.0).horizontal
    finally:
        torch.compiler.is_compiling = compiling
    print(
        f"sixth knots rounded differently by the compiling form: {int((product[:, 5] != knots[:, 5]).sum())} of {ROWS}"
    )


if __name__ == "__main__":
    main()
