"""The task: prior, confidential-data simulator, summary statistic, mechanism and observed release."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor
from torch.distributions import Distribution, Transform, identity_transform

from ..mechanisms import Mechanism
from ..mechanisms.base import check_exact_integers
from ..seeds import seeded_global_streams

Simulator = Callable[[Tensor, "torch.Generator | None"], Tensor]
#: Prior draws on which a task's prior and transform are checked at construction (:func:`prior_problem`).
PRIOR_CHECK_DRAWS = 256
#: Seed of those draws (torch's global streams are restored after them).
PRIOR_CHECK_SEED = 20261125


@dataclass
class Task:
    """A private-data inference problem.

    ``simulator(theta, generator)`` maps parameters ``(n, dim_theta)`` to confidential summaries
    ``(n, dim_s)`` (a torch tensor or numpy array of any numeric dtype; :meth:`simulate` converts it to
    torch's default float dtype on ``theta``'s device; ``None`` when every simulation comes from elsewhere,
    see ``SequentialEstimator.append_simulations``); the curator's release is ``mechanism.sample(s)``.
    ``transform`` maps the unconstrained space ``R^dim_unconstrained`` onto the prior's support (flows work
    there). ``parameter_names`` default to ``theta_1, ..., theta_d``; ``release_names``, one per coordinate of the
    release (the columns of ``dpsbi-sample --releases``, the coordinates its warnings name), default to
    :func:`default_release_names` (``y0, ..., y{dim_s - 1}``). The release, the true parameter and the names are
    checked at construction (:meth:`validate`); ``y_obs`` is kept as ``(n, dim_s)``.

    ``statistic_bounds``: where known, the range ``(low, high)`` of the statistic behind each release coordinate
    (two numbers for every coordinate, or two sequences of ``dim_s`` numbers; ``-inf`` / ``inf`` where unbounded;
    e.g. ``(0, 1)`` for proportions),
    held as a ``(2, dim_s)`` float64 tensor; simulated statistics outside it are an error. Where the mechanism
    loses nothing by it (:attr:`~dpsbi.mechanisms.Mechanism.clamp_lossless`), posterior flows clamp releases to it
    (:meth:`release_bounds`), so that a release with one far noise draw reaches the flow as one it has seen.
    """

    name: str
    prior: Distribution
    simulator: Simulator | None
    mechanism: Mechanism
    epsilon: float
    y_obs: Tensor | None = None
    true_theta: Tensor | None = None
    s_obs: Tensor | None = None
    transform: Transform = field(default_factory=lambda: identity_transform)
    parameter_names: list[str] = field(default_factory=list)
    #: False for data that were not produced by ``mechanism`` (real outbreaks): methods that need
    #: ``mechanism.log_prob(y_obs, s)`` refuse such a task.
    release_from_mechanism: bool = True
    #: Exact posterior at a release, where one is known in closed form (test oracle).
    exact_posterior: Callable[[Tensor], Distribution] | None = None
    description: str = ""
    #: ``{"name", "kwargs"}`` that rebuild it with :func:`dpsbi.tasks.load` (set by ``load``; saved posteriors use it).
    spec: dict | None = None
    release_names: list[str] = field(default_factory=list)
    statistic_bounds: Tensor | None = None
    #: True where one simulation costs about a millisecond of CPU or more (SIR's exact Gillespie simulator: about
    #: 15 CPU ms): defaults that would draw a million simulations (an amortized
    #: SPPE fit, :meth:`~dpsbi.inference.sppe.SPPE.default_sims_per_round`) draw a tenth of them.
    costly_simulator: bool = False
    #: True where the releases an amortized fit misses are made by one far noise draw rather than by parameters in
    #: the prior's tails (naive Bayes: a cell 8-11 Laplace scales out): an amortized SPPE fit then widens its
    #: training noise by default (:meth:`~dpsbi.inference.sppe.SPPE.default_widening`), as does an amortized SPLE fit
    #: along the statistic's linear constraints where it has them (:meth:`~dpsbi.inference.sple.SPLE.default_widening`).
    amortized_widening: bool = False
    #: The task's own measured recipe for an amortized SPPE fit: SPPE keyword arguments (``rounds`` with the
    #: ``sims_per_round`` and ``training`` fields that go with it, ``task_options``, ``epsilon_margin``) that
    #: :class:`~dpsbi.inference.sppe.SPPE` takes where an ``amortized=True`` call leaves them out
    #: (:meth:`~dpsbi.inference.sppe.SPPE.resolve_arguments`); empty: the generic amortized defaults (SIR's: its
    #: factory, docs/RESULTS.md "SIR's amortized default").
    amortized_recipe: dict = field(default_factory=dict)
    #: The task's own measured recipe for a sequential SPPE fit at ``y_obs``: ``truncate`` (the TSNPE posterior
    #: mass its later rounds cut the prior at, where atomic APT's leaked tails were measured:
    #: :meth:`~dpsbi.inference.sppe.SPPE.default_truncate`), ``sims_per_round`` and ``training``
    #: (:class:`~dpsbi.inference.training.TrainingSettings` fields under the call's; both where the call leaves out
    #: ``rounds`` and ``sims_per_round``), applied by :meth:`~dpsbi.inference.sppe.SPPE.resolve_arguments`; empty:
    #: atomic APT on the generic schedule (SIR's: its factory, docs/RESULTS.md "SIR's sequential recipe";
    #: regression's: 2000 simulations a round).
    sequential_recipe: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.parameter_names and len(getattr(self.prior, "event_shape", ())) == 1:
            self.parameter_names = [f"theta_{i + 1}" for i in range(self.dim_theta)]
        self.parameter_names = list(self.parameter_names)
        if not self.release_names and isinstance(self.mechanism, Mechanism):
            self.release_names = default_release_names(self.dim_s)
        self.release_names = list(self.release_names)
        if self.statistic_bounds is not None:
            try:
                bounds = torch.as_tensor(self.statistic_bounds, dtype=torch.float64).clone()
            except (TypeError, ValueError, RuntimeError):
                raise ValueError(
                    f"task {self.name!r}: statistic_bounds must be (low, high), two sequences of numbers, "
                    f"got {self.statistic_bounds!r}"
                ) from None
            if bounds.shape == (2,) and isinstance(
                self.mechanism, Mechanism
            ):  # one range for every coordinate
                bounds = bounds[:, None].expand(2, self.dim_s).clone()
            self.statistic_bounds = bounds
        self.validate()
        if self.y_obs is not None:  # held in the mechanism's dtype (float64 for counts)
            self.y_obs = self.check_release(self.y_obs).to(self.mechanism.dtype)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the problem if the prior (see :func:`prior_problem`), the mechanism, ``y_obs``
        or ``true_theta`` cannot be used (shapes, support, finiteness), if ``parameter_names`` or ``release_names``
        are not one distinct string per coordinate (:func:`names_problem`), or if ``epsilon`` is not the
        mechanism's; called at construction and by the estimators.

        ``epsilon`` must be one of the privacy levels the mechanism states: its ``epsilon``, the target it was
        calibrated from (``BinomialCurve.target_epsilon``) or the ``mu`` of a Gaussian-DP mechanism
        (``Gaussian.gdp``). Tasks whose data are not a release of the mechanism (``release_from_mechanism=False``)
        are exempt."""
        if not isinstance(self.mechanism, Mechanism):
            raise ValueError(
                f"task {self.name!r}: mechanism must be a dpsbi Mechanism, got {type(self.mechanism).__name__}"
            )
        if not isinstance(self.epsilon, numbers.Real):
            raise ValueError(f"task {self.name!r}: epsilon must be a number, got {self.epsilon!r}")
        if self.release_from_mechanism:
            stated = {
                k: float(getattr(self.mechanism, k))
                for k in ("epsilon", "target_epsilon", "mu")
                if hasattr(self.mechanism, k)
            }
            if not any(math.isclose(self.epsilon, v, rel_tol=1e-6) for v in stated.values()):
                levels = ", ".join(f"{k}={v:g}" for k, v in stated.items())
                raise ValueError(
                    f"task {self.name!r}: epsilon={self.epsilon:g} disagrees with its mechanism {self.mechanism!r} "
                    f"({levels}); state epsilon once, when building the mechanism"
                )
        if len(self.prior.event_shape) != 1:
            raise ValueError(
                f"task {self.name!r}: the prior must be over vectors (event shape (d,)), got {tuple(self.prior.event_shape)}"
            )
        problem = prior_problem(self.prior, self.transform)
        if problem:
            raise ValueError(f"task {self.name!r}: {problem}")
        for problem in (
            names_problem("parameter_names", self.parameter_names, self.dim_theta),
            names_problem("release_names", self.release_names, self.dim_s),
        ):
            if problem:
                raise ValueError(f"task {self.name!r}: {problem}")
        bounds = self.statistic_bounds
        if bounds is not None and (
            bounds.shape != (2, self.dim_s) or bounds.isnan().any() or not (bounds[0] < bounds[1]).all()
        ):
            raise ValueError(
                f"task {self.name!r}: statistic_bounds must be (low, high) with low < high: two numbers for every "
                f"coordinate, or two sequences of {self.dim_s} numbers, one per coordinate; got {bounds.tolist()}"
            )
        if self.y_obs is not None:
            self.check_release(self.y_obs)
        if self.true_theta is not None:
            self.check_theta(self.true_theta)

    def release_bounds(self) -> Tensor | None:
        """``(2, dim_s)`` float64: the bounds each release coordinate can be clamped to without changing any
        posterior (:attr:`statistic_bounds` where the mechanism's noise allows it,
        :attr:`~dpsbi.mechanisms.Mechanism.clamps_lossless`; ``-inf`` / ``inf`` elsewhere), or ``None`` where that
        leaves nothing to clamp."""
        if self.statistic_bounds is None:
            return None
        lossless = torch.tensor(self.mechanism.clamps_lossless).unsqueeze(0)
        infinite = torch.tensor([[-math.inf], [math.inf]], dtype=torch.float64)
        bounds = torch.where(lossless, self.statistic_bounds, infinite)
        return bounds if bounds.isfinite().any() else None

    @property
    def dim_theta(self) -> int:
        """Dimension of a parameter vector in the prior's space."""
        return int(self.prior.event_shape[0])

    @property
    def dim_unconstrained(self) -> int:
        """Dimension of the unconstrained space the flows work in."""
        return int(self.transform.inv.forward_shape(self.prior.event_shape)[0])

    @property
    def dim_s(self) -> int:
        """Dimension of the release (``mechanism.dim``); the confidential summary has ``mechanism.input_dim``, the
        same unless the mechanism composes releases or post-processes them."""
        return self.mechanism.dim

    def log_prior(self, theta: Tensor) -> Tensor:
        """``log prior(theta)`` of shape ``(n,)`` for ``theta (n, dim_theta)``: ``-inf`` outside the prior's
        support (where ``Distribution.log_prob`` would raise) and where the density is not a number."""
        support = self.prior.support
        inside = support.check(theta)
        if support.event_dim == 0:
            inside = inside.all(-1)
        safe = torch.where(inside[:, None], theta, self.prior.mean.to(theta).expand_as(theta))
        lp = self.prior.log_prob(safe)
        return torch.where(inside & ~lp.isnan(), lp, -math.inf)

    def simulate(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Confidential summaries ``(n, mechanism.input_dim)`` (usually ``dim_s``) for parameters ``(n, dim_theta)``; errors on NaN or bad shapes."""
        if self.simulator is None:
            raise ValueError(
                f"task {self.name!r} has no simulator: hand the estimator simulations made elsewhere (append_simulations)"
            )
        theta = self.check_theta(theta)
        return self.check_summary(theta, self.simulator(theta, generator), "simulator returned")

    def check_summary(self, theta: Tensor, s, source: str = "summaries") -> Tensor:
        """Confidential summaries ``s`` of parameters ``theta (n, dim_theta)`` (any numeric tensor or numpy
        array) as ``(n, mechanism.input_dim)`` in the mechanism's dtype (torch's default; float64 for counts), or
        an error naming ``source`` and the problem (complex numbers, shape, NaN/inf, counts too large for their
        dtype)."""
        try:
            s = as_summary(s, theta.device)
        except TypeError as error:
            raise RuntimeError(f"task {self.name!r}: {source} {error}") from None
        if self.mechanism.dtype == torch.float64:
            try:
                check_exact_integers(f"task {self.name!r}: {source}", s)
            except ValueError as error:
                raise RuntimeError(str(error)) from None
        s = s.to(self.mechanism.dtype)
        expected = (theta.shape[0], self.mechanism.input_dim)
        if s.shape != expected:
            raise RuntimeError(f"task {self.name!r}: {source} shape {tuple(s.shape)}, expected {expected}")
        bad = ~torch.isfinite(s).all(-1)
        if bad.any():
            rows = bad.nonzero().flatten()[:5].tolist()
            raise RuntimeError(
                f"task {self.name!r}: {source} NaN/inf for theta rows {rows}, e.g. theta={theta[rows[0]].tolist()}"
            )
        if self.statistic_bounds is not None and s.shape[-1] == self.dim_s:
            low, high = self.statistic_bounds.to(s)
            slack = (
                64 * torch.finfo(s.dtype).eps * (1 + self.statistic_bounds.abs().to(s))
            )  # a sum's rounding
            outside = ((s < low - slack[0]) | (s > high + slack[1])).any(-1)
            if outside.any():
                rows = outside.nonzero().flatten()[:5].tolist()
                raise RuntimeError(
                    f"task {self.name!r}: {source} statistics outside statistic_bounds for theta rows {rows}, "
                    f"e.g. {s[rows[0]].tolist()} (bounds {self.statistic_bounds.tolist()})"
                )
        try:
            self.mechanism.check_input(s)
        except ValueError as error:
            raise RuntimeError(
                f"task {self.name!r}: {source} statistics the mechanism refuses: {error}"
            ) from None
        return s

    def release(self, s: Tensor, u: Tensor | None = None, generator: torch.Generator | None = None) -> Tensor:
        """Releases ``mechanism.sample(s, u)`` for confidential summaries ``s``."""
        return self.mechanism.sample(s, u, generator=generator)

    def simulate_release(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Releases ``(n, dim_s)`` for parameters ``(n, dim_theta)``: simulator, then mechanism."""
        return self.release(self.simulate(theta, generator), generator=generator)

    def check_theta(self, theta: Tensor) -> Tensor:
        """Return ``theta`` as ``(n, dim_theta)`` or raise ``ValueError`` naming the problem."""
        if not torch.is_tensor(theta):
            theta = torch.as_tensor(theta, dtype=torch.get_default_dtype())
        if theta.ndim != 2 or theta.shape[-1] != self.dim_theta:
            raise ValueError(
                f"task {self.name!r}: theta must have shape (n, {self.dim_theta}), got {tuple(theta.shape)}"
            )
        support = self.prior.support
        inside = support.check(theta)
        if support.event_dim == 0:
            inside = inside.all(-1)
        if not bool(inside.all()):
            row = (~inside).nonzero().flatten()[0].item()
            raise ValueError(
                f"task {self.name!r}: theta row {row} lies outside the prior's support: {theta[row].tolist()}"
            )
        return theta

    def check_release(self, y) -> Tensor:
        """Return a release (tensor, array, sequence or number) as ``(n, dim_s)``, or raise ``ValueError`` (not
        numbers, wrong shape, NaN/inf, outside the mechanism's support). A number is a release of a
        one-dimensional mechanism (``(1, 1)``)."""
        y = release_tensor(y, self.dim_s, f"task {self.name!r}: release", self.mechanism.dtype)
        if self.release_from_mechanism:
            return self.mechanism.validate_release(y)
        y = y.unsqueeze(0) if y.ndim == 1 else y
        if y.ndim != 2 or y.shape[-1] != self.dim_s:
            raise ValueError(
                f"task {self.name!r}: release must have shape (n, {self.dim_s}), got {tuple(y.shape)}"
            )
        if not torch.isfinite(y).all():
            raise ValueError(f"task {self.name!r}: the release holds NaN or inf: {y.tolist()}")
        return y

    def require_mechanism_release(self, method: str) -> None:
        """Raise if ``method`` needs ``log eta(y_obs | s)`` but ``y_obs`` did not come from the mechanism, or the
        mechanism has no exact likelihood (:class:`~dpsbi.mechanisms.IntractableLikelihood`)."""
        if not self.release_from_mechanism:
            raise ValueError(
                f"{method} evaluates the mechanism's density at y_obs, but task {self.name!r} holds observed "
                "data that are not a release of its mechanism; use a simulation-based method (SPPE, SPLE, SMC-ABC)"
            )
        self.mechanism.require_log_prob(method)  # e.g. post-processing with an intractable likelihood

    def __repr__(self) -> str:
        return (
            f"Task({self.name!r}, epsilon={self.epsilon:g}, dim_theta={self.dim_theta}, dim_s={self.dim_s}, "
            f"mechanism={self.mechanism!r})"
        )


def prior_problem(prior: Distribution, transform: Transform) -> str | None:
    """Why ``prior`` and its ``transform`` (from the unconstrained space onto its support) cannot serve a task,
    or ``None``: a discrete support (the flows need a continuous prior), or, on :data:`PRIOR_CHECK_DRAWS` of
    the prior's own draws under :data:`PRIOR_CHECK_SEED`, a log density that is NaN or infinite, or a draw
    that ``transform.inv`` and ``transform`` do not map back and forth finitely. Names the prior and the
    first failing draw; torch's global random streams are left as they were."""
    name = type(prior).__name__
    discrete = discrete_prior_problem(prior)
    if discrete:
        return discrete
    with seeded_global_streams(PRIOR_CHECK_SEED):
        theta = prior.sample((PRIOR_CHECK_DRAWS,))
    log_prob = prior.log_prob(theta)
    bad = ~torch.isfinite(log_prob)
    if bad.any():
        row = int(bad.nonzero()[0])
        return (
            f"the prior {name}'s log_prob is {float(log_prob[row])} at its own draw theta={theta[row].tolist()}; "
            "fix the prior so that its log density is finite wherever it draws"
        )
    z = transform.inv(theta)
    back = transform(z)
    lost = ~(torch.isfinite(z).all(-1) & torch.isclose(back, theta, rtol=1e-3, atol=1e-5).all(-1))
    if lost.any():
        row = int(lost.nonzero()[0])
        return (
            f"transform {transform} does not map transform.inv(theta) back to theta for the prior draw "
            f"{theta[row].tolist()} of {name} (z={z[row].tolist()}, back to {back[row].tolist()}): the prior's support is "
            "larger than the transform's image"
        )
    return None


def discrete_prior_problem(prior: Distribution) -> str | None:
    """Why a discrete ``prior`` cannot serve a task (``None`` for a continuous one)."""
    if not prior.support.is_discrete:
        return None
    return (
        f"the prior {type(prior).__name__} is discrete (support {prior.support}); dpsbi fits continuous "
        "densities: use a continuous prior (e.g. dpsbi.tasks.box or normal) and round inside the simulator"
    )


def prior_device(prior: Distribution) -> torch.device:
    """The device of the prior's draws (its mean's; the CPU when it has none)."""
    try:
        return prior.mean.device
    except NotImplementedError:
        return torch.device("cpu")


def default_release_names(dim: int) -> list[str]:
    """The names of a release's ``dim`` coordinates where a task gives none: ``y0, ..., y{dim - 1}``."""
    return [f"y{i}" for i in range(dim)]


def names_problem(what: str, names, d: int) -> str | None:
    """Why ``names`` (``what``: ``"parameter_names"`` or ``"release_names"``) are not ``d`` distinct strings,
    or ``None``; a release coordinate may not be called ``epsilon`` (the privacy-level column of a releases CSV)."""
    names = list(names)
    if len(names) != d or not all(isinstance(n, str) for n in names) or len(set(names)) != d:
        return f"{what} must be {d} distinct strings, got {names!r}"
    if what == "release_names" and "epsilon" in names:
        return f"release_names may not use 'epsilon' (the column of each release's epsilon), got {names!r}"
    return None


def release_tensor(y, dim: int, what: str = "release", dtype: torch.dtype | None = None) -> Tensor:
    """``y`` (tensor, array, sequence or number) as a floating tensor, a number as ``(1, 1)`` when ``dim`` is 1;
    ``ValueError`` starting with ``what`` for a number when ``dim > 1``, for values that are not numbers and
    for NaN/inf (naming the first position). Numbers and integer tensors become ``dtype`` (default: torch's
    default), read through float64 so that counts up to 2^53 stay exact where ``dtype`` is float64."""
    dtype = dtype or torch.get_default_dtype()
    try:
        y = y if torch.is_tensor(y) else torch.as_tensor(y, dtype=torch.float64).to(dtype)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"{what} must be numbers, got {y!r} ({error})") from None
    y = y if y.is_floating_point() else y.to(dtype)
    if y.ndim == 0:
        if dim != 1:
            raise ValueError(f"{what} must have shape ({dim},) or (n, {dim}), got a scalar ({float(y):g})")
        y = y.reshape(1, 1)
    bad = ~torch.isfinite(y)
    if bad.any():
        first = bad.nonzero()[0].tolist()
        kind = "NaN" if bool(torch.isnan(y[tuple(first)])) else "inf"
        where = f" (row {first[0]}, coordinate {first[1]})" if len(first) == 2 else ""
        shown = y[first[0]] if y.ndim > 1 else y
        raise ValueError(f"{what} holds {kind} at position {first}{where}: {shown.tolist()}")
    return y


def as_summary(s, device: torch.device) -> Tensor:
    """A simulator's output (torch tensor or numpy array, any numeric dtype) as a floating tensor on ``device``
    that holds it exactly: float64 for float64 and integer output (counts stay exact up to 2^53), else torch's
    default float dtype (:meth:`Task.check_summary` then converts it to the mechanism's dtype). Complex output is a
    ``TypeError`` (converting it would drop the imaginary part)."""
    if not torch.is_tensor(s):
        s = torch.from_numpy(np.asarray(s))
    if s.is_complex():
        raise TypeError(f"complex numbers ({s.dtype}); a summary is real")
    exact = s.dtype == torch.float64 or not (s.is_floating_point() or s.dtype == torch.bool)
    return s.to(device=device, dtype=torch.float64 if exact else torch.get_default_dtype())


def observed_release(
    name: str,
    epsilon: float,
    y_obs: Tensor | list | str | None,
    stored: dict[float, list[float]],
    simulate: Callable[[torch.Generator], Tensor],
    seed: int = 0,
) -> Tensor | None:
    """The task's observed release as ``(1, dim_s)``.

    ``y_obs=None`` takes the release stored for ``epsilon`` (the papers' values); a tensor or list is
    the user's own release; ``"simulate"`` draws one from the true parameter with ``seed``.
    """
    if isinstance(y_obs, str):
        if y_obs != "simulate":
            raise ValueError(f"task {name!r}: y_obs must be a release, None or 'simulate', got {y_obs!r}")
        return simulate(torch.Generator().manual_seed(seed))
    if (
        y_obs is not None
    ):  # kept in float64 (counts exact up to 2^53); the task holds it in its mechanism's dtype
        return release_tensor(y_obs, -1, f"task {name!r}: y_obs", torch.float64).reshape(1, -1)
    for eps, values in stored.items():
        if abs(eps - epsilon) <= 1e-9 * max(1.0, eps):
            return torch.tensor([values], dtype=torch.float64)
    known = ", ".join(f"{e:g}" for e in stored) or "none"
    raise ValueError(
        f"task {name!r} has no stored release at epsilon={epsilon:g} (stored: {known}); "
        "pass y_obs=<your release> or y_obs='simulate'"
    )
