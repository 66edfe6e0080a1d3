"""A conditional neural spline flow with no host synchronization: the architecture of sbi's ``build_nsf`` (the main
paper's) built from zuko's rational-quadratic spline, whose bins are found by comparison sums and whose tails are a
``torch.where``, so that ``log_prob``, ``sample_and_log_prob`` and their gradients never wait for the device and
trace whole with ``torch.compile(fullgraph=True)``. The knots of a value's bin are picked by a one-hot product, not
``gather``, and a coupling's halves are strided slices, not ``index_select`` / ``index_copy``: the same values, and
a backward pass without atomic adds, so that torch's deterministic mode (a fit on CUDA) has nothing to replace with
slower kernels.

Layers, from the data to the base noise: the z-scoring of the data, then ``transforms`` times a coupling spline
(alternating halves) followed by an LU-factorized linear map (when ``dim > 1``); the base is a standard normal.
Each coupling's conditioner is a residual net (``blocks`` blocks of ``hidden`` ReLU units, gated by the context
as in nflows' ``ResidualNet``) of the untouched half and the context; for ``dim = 1`` it sees the context only.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from zuko.transforms import MonotonicRQSTransform


class ResidualBlock(nn.Module):
    """``h + W2 relu(W1 relu(h))`` gated by the context (GLU), the last layer initialized near zero."""

    def __init__(self, features: int, context_features: int) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(features, features), nn.Linear(features, features)
        self.context = nn.Linear(context_features, features)
        nn.init.uniform_(self.second.weight, -1e-3, 1e-3)
        nn.init.uniform_(self.second.bias, -1e-3, 1e-3)

    def forward(self, h: Tensor, context: Tensor) -> Tensor:
        """``h (n, features)``, ``context (n, context_features)`` -> ``(n, features)``."""
        out = self.second(F.relu(self.first(F.relu(h))))
        return h + F.glu(torch.cat([out, self.context(context)], -1), -1)


class ResidualNet(nn.Module):
    """``(inputs (n, in), context (n, c)) -> (n, out)``: a linear layer of both, ``blocks`` residual blocks of
    ``hidden`` units, a linear output layer."""

    def __init__(self, in_features: int, out_features: int, context_features: int, hidden: int, blocks: int):
        super().__init__()
        self.initial = nn.Linear(in_features + context_features, hidden)
        self.blocks = nn.ModuleList(ResidualBlock(hidden, context_features) for _ in range(blocks))
        self.final = nn.Linear(hidden, out_features)

    def forward(self, inputs: Tensor, context: Tensor) -> Tensor:
        h = self.initial(torch.cat([inputs, context], -1))
        for block in self.blocks:
            h = block(h, context)
        return self.final(h)


class OneHotRQSTransform(MonotonicRQSTransform):
    """zuko's monotonic rational-quadratic spline with the knots of each value's bin picked by a one-hot product
    over the ``bins + 1`` knots instead of ``gather``: the same values (one term of each sum is not zero), and a
    backward pass of products and sums where ``gather``'s adds with atomics on CUDA. The knots are zuko's
    running sums of the bins, taken along the leading dimension (:func:`running_sum`)."""

    def __init__(
        self, widths: Tensor, heights: Tensor, derivatives: Tensor, bound: float = 5.0, slope: float = 1e-3
    ) -> None:
        """zuko's constructor (``widths``, ``heights`` ``(*, K)``, ``derivatives`` ``(*, K - 1)``, unconstrained),
        its ``cumsum`` replaced by :func:`running_sum`."""
        super(MonotonicRQSTransform, self).__init__()
        widths = widths / (1 + abs(2 * widths / math.log(slope)))
        heights = heights / (1 + abs(2 * heights / math.log(slope)))
        derivatives = derivatives / (1 + abs(derivatives / math.log(slope)))
        widths = F.pad(F.softmax(widths, dim=-1), (1, 0), value=0)
        heights = F.pad(F.softmax(heights, dim=-1), (1, 0), value=0)
        self.horizontal = bound * (2 * running_sum(widths) - 1)
        self.vertical = bound * (2 * running_sum(heights) - 1)
        self.derivatives = torch.exp(F.pad(derivatives, (1, 1), value=0))

    def bin(self, k: Tensor) -> tuple[Tensor, ...]:
        """For bin indices ``k (*)``: whether ``k`` is a bin, the bin's knots ``x0, x1``, values ``y0, y1`` and
        slopes ``d0, d1``, and its mean slope ``s`` (each ``(*)``), as zuko's ``bin``."""
        mask = torch.logical_and(0 <= k, k < self.bins)
        k = (k % self.bins).unsqueeze(-1)
        knots = torch.arange(self.bins + 1, device=k.device)
        left, right = (k == knots).to(self.horizontal.dtype), (k + 1 == knots).to(self.horizontal.dtype)
        x0, x1 = (self.horizontal * left).sum(-1), (self.horizontal * right).sum(-1)
        y0, y1 = (self.vertical * left).sum(-1), (self.vertical * right).sum(-1)
        d0, d1 = (self.derivatives * left).sum(-1), (self.derivatives * right).sum(-1)
        return mask, x0, x1, y0, y1, d0, d1, (y1 - y0) / (x1 - x0)

    def inv_and_ladj(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """``x = T^-1(y)`` and ``log |dT/dx|`` at that ``x`` (each ``(*)``), from one bin lookup: zuko's
        ``_inverse`` with the forward slope (``call_and_ladj``'s formula) at the same place in the bin."""
        k = self.searchsorted(self.vertical, y) - 1
        mask, x0, x1, y0, y1, d0, d1, s = self.bin(k)
        y_ = mask * (y - y0)
        a = (y1 - y0) * (s - d0) + y_ * (d0 + d1 - 2 * s)
        b = (y1 - y0) * d0 - y_ * (d0 + d1 - 2 * s)
        c = -s * y_
        z = 2 * c / (-b - (b**2 - 4 * a * c).sqrt())
        slope = s**2 * (2 * s * z * (1 - z) + d0 * (1 - z) ** 2 + d1 * z**2)
        slope = slope / (s + (d0 + d1 - 2 * s) * z * (1 - z)) ** 2
        return torch.where(mask, x0 + z * (x1 - x0), y), mask * slope.log()


def running_sum(x: Tensor) -> Tensor:
    """The running sums of ``x (*, K)`` along its last dimension, computed along the leading one: the values of
    ``cumsum(dim=-1)`` (each a sum in the same order), but on CUDA a scan down columns, one thread each, where
    torch's scan of a short last dimension took 1.7 ms for 100 000 x 2 rows of 11 knots (64 % of a training
    step of 100 000 flow evaluations on an H200; docs/RESULTS.md, "On a GPU").

    While ``torch.compile`` traces, a product with the ``(K, K)`` upper-triangular matrix of ones instead (autocast
    off, so in ``x``'s precision under bf16-mixed too): the same sums to rounding, where torch's CPU code generator
    (inductor, torch 2.13) differentiates a cumulative sum after a softmax wrongly (the spline's widths' and
    heights' gradients off by 75-132 %; docs/RESULTS.md, "Compiled on the CPU")."""
    if torch.compiler.is_compiling():
        ones = torch.ones(x.shape[-1], x.shape[-1], dtype=x.dtype, device=x.device).triu()
        with torch.autocast(x.device.type, enabled=False):
            return x @ ones
    return x.movedim(-1, 0).cumsum(0).movedim(0, -1)


class CouplingSpline(nn.Module):
    """Rational-quadratic splines on every other coordinate from ``first`` (identity outside ``[-bound, bound]``),
    their bins, heights and knot slopes given by a residual net of the other coordinates and the context."""

    def __init__(self, dim: int, first: int, context_features: int, settings) -> None:
        super().__init__()
        self.transformed, self.kept = slice(first, None, 2), slice(1 - first, None, 2)
        count = len(range(dim)[self.transformed])
        self.bins, self.bound = int(settings.bins), float(settings.tail_bound)
        out = count * (3 * self.bins - 1)
        self.net = ResidualNet(dim - count, out, context_features, int(settings.hidden), int(settings.blocks))

    def _spline(self, x: Tensor, context: Tensor) -> tuple[OneHotRQSTransform, Tensor]:
        """The spline of the transformed coordinates and their values, for ``x (n, dim)``."""
        part = x[..., self.transformed]
        params = self.net(x[..., self.kept], context).reshape(*part.shape, 3 * self.bins - 1)
        widths, heights, slopes = params.split([self.bins, self.bins, self.bins - 1], -1)
        scale = self.net.final.in_features**-0.5  # as nflows: bin logits start small, the bins near uniform
        return OneHotRQSTransform(widths * scale, heights * scale, slopes, bound=self.bound), part

    def _with(self, x: Tensor, values: Tensor) -> Tensor:
        """``x`` with its transformed coordinates replaced by ``values``."""
        out = x.clone()
        out[..., self.transformed] = values
        return out

    def forward(self, x: Tensor, context: Tensor) -> tuple[Tensor, Tensor]:
        """Towards the noise: ``(y (n, dim), log |det| (n,))``."""
        spline, part = self._spline(x, context)
        y, ladj = spline.call_and_ladj(part)
        return self._with(x, y), ladj.sum(-1)

    def inverse(self, y: Tensor, context: Tensor) -> tuple[Tensor, Tensor]:
        """Towards the data: ``(x (n, dim), log |det| (n,))``, the log-determinant :meth:`forward`'s at ``x`` (the
        kept coordinates are unchanged, so they condition the same spline)."""
        spline, part = self._spline(y, context)
        x, ladj = spline.inv_and_ladj(part)
        return self._with(y, x), ladj.sum(-1)


class LULinear(nn.Module):
    """``y = x W' + b`` with ``W = L U`` (``L`` unit lower-triangular, ``U`` upper-triangular with a softplus
    diagonal), initialized at the identity as nflows' ``LULinear``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lower = nn.Parameter(torch.zeros(dim, dim))
        self.upper = nn.Parameter(torch.zeros(dim, dim))
        self.diagonal = nn.Parameter(torch.full((dim,), math.log(math.expm1(1 - 1e-3))))
        self.bias = nn.Parameter(torch.zeros(dim))

    def _factors(self) -> tuple[Tensor, Tensor]:
        eye = torch.eye(self.bias.shape[0], device=self.bias.device, dtype=self.bias.dtype)
        lower = self.lower.tril(-1) + eye
        upper = self.upper.triu(1) + torch.diag(F.softplus(self.diagonal) + 1e-3)
        return lower, upper

    def forward(self, x: Tensor, context: Tensor) -> tuple[Tensor, Tensor]:
        lower, upper = self._factors()
        return x @ (lower @ upper).T + self.bias, self._ladj(upper, x.shape[0])

    def inverse(self, y: Tensor, context: Tensor) -> tuple[Tensor, Tensor]:
        """``(x (n, dim), log |det| (n,))``, the log-determinant :meth:`forward`'s."""
        lower, upper = self._factors()
        rhs = (y - self.bias).T
        solved = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
        return torch.linalg.solve_triangular(upper, solved, upper=True).T, self._ladj(upper, y.shape[0])

    @staticmethod
    def _ladj(upper: Tensor, n: int) -> Tensor:
        """``log |det W|`` from the factor ``upper``, for each of ``n`` rows ``(n,)``."""
        return torch.log(upper.diagonal()).sum().expand(n)


class SplineFlow(nn.Module):
    """A density ``q(x | h)`` over ``x (n, dim)`` given features ``h (n, context_features)`` (the embedded
    context), with the z-scoring ``mean``, ``std`` of ``x`` as buffers. ``settings``: a
    :class:`~dpsbi.inference.flows.FlowSettings` (``transforms``, ``hidden``, ``blocks``, ``bins``,
    ``tail_bound``)."""

    def __init__(self, dim: int, context_features: int, settings, mean: Tensor, std: Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean.reshape(dim).clone())
        self.register_buffer("std", std.reshape(dim).clone())
        layers: list[nn.Module] = []
        for i in range(int(settings.transforms)):
            first = i % 2 if dim > 1 else 0  # nflows' alternating masks
            layers.append(CouplingSpline(dim, first, context_features, settings))
            if dim > 1:
                layers.append(LULinear(dim))
        self.layers = nn.ModuleList(layers)

    def log_prob(self, x: Tensor, features: Tensor) -> Tensor:
        """``log q(x | h)`` of shape ``(n,)``; ``x`` wider than the weights (float64 counts beyond 2^24) is
        z-scored in its own precision, then converted."""
        z = ((x - self.mean.to(x.dtype)) / self.std.to(x.dtype)).to(self.std.dtype)
        total = -torch.log(self.std).sum().expand(x.shape[0])
        for layer in self.layers:
            z, ladj = layer(z, features)
            total = total + ladj
        return total - 0.5 * (z**2).sum(-1) - 0.5 * z.shape[-1] * math.log(2 * math.pi)

    def sample_and_log_prob(self, noise: Tensor, features: Tensor) -> tuple[Tensor, Tensor]:
        """The image ``x (n, dim)`` of standard normal ``noise (n, dim)`` under the flow's inverse and
        ``log q(x | h)`` ``(n,)`` from the same pass (:meth:`log_prob`'s value to float rounding, where the flow
        inverts well in its dtype)."""
        x, total = noise, torch.log(self.std).sum().expand(noise.shape[0])
        for layer in reversed(self.layers):
            x, ladj = layer.inverse(x, features)
            total = total - ladj
        log_q = -0.5 * (noise**2).sum(-1) - 0.5 * noise.shape[-1] * math.log(2 * math.pi) - total
        return x * self.std + self.mean, log_q
