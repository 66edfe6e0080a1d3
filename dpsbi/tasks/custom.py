"""Your own model as a task: :func:`from_simulator` takes a prior, a simulator of the confidential summary,
the curator's mechanism and the observed release; :func:`box` and :func:`normal` build common priors. By import
path, the registered task ``custom`` (:func:`make`): ``dpsbi.tasks.load("custom", factory="mymodel:make_task",
**kwargs)``, on the command line ``dpsbi-run task=custom task.factory=mymodel:make_task``.

Sensitivity, the one number you must get right when building the mechanism
(``dpsbi.mechanisms.Laplace(epsilon, sensitivity, dim)``, ``Gaussian(epsilon, delta, sensitivity, dim)``):

- **Laplace** takes the **L1** sensitivity of the *whole* released statistic: the largest
  ``sum_j |s_j(x) - s_j(x')|`` over datasets ``x, x'`` differing in one record.
- **Gaussian** takes its **L2** sensitivity: the largest ``sqrt(sum_j (s_j(x) - s_j(x'))^2)``.

Example, a clamped mean: ``n`` records clamped to ``[a, b]``; changing one record moves their mean by at
most ``(b - a) / n``, which is the sensitivity of one mean. For a vector of ``d`` such means (``d`` clamped
columns of the same ``n`` records) every coordinate can move by ``(b - a) / n`` at once, so
``L1 = d (b - a) / n`` (Laplace) and ``L2 = sqrt(d) (b - a) / n`` (Gaussian). With ``n = 100``,
``[a, b] = [0, 10]`` and ``d = 3``: ``Laplace(epsilon, sensitivity=0.3, dim=3)`` or
``Gaussian(epsilon, delta, sensitivity=0.1732, dim=3)``.

Randomness: dpsbi hands every simulation call a ``torch.Generator`` (seeded from the run's ``seed``) so that
runs are reproducible and a resumed checkpoint can check its simulations. The simulator receives it as:

- ``simulator(theta, rng)`` (a second positional parameter without a default, or with default ``None``):
  ``rng`` is that ``torch.Generator`` for a torch simulator (``None`` means torch's global stream), or a
  ``numpy.random.Generator`` seeded from it for ``backend="numpy"``. Draw all randomness from ``rng``.
- ``simulator(theta)``: it runs with torch's global stream and numpy's global ``np.random`` stream seeded
  from the generator (both restored afterwards), so ``torch.randn`` and ``np.random.normal`` inside it are
  reproducible too; a ``numpy.random.default_rng()`` created inside it without a seed is not.

Parallel simulation (``from_simulator(..., workers=N)``): each call's rows are cut into chunks of
``chunk_size`` rows, every chunk gets its own seed (spawned from one seed drawn from the call's generator)
and the chunks run in ``N`` joblib worker processes, so the draws depend on ``chunk_size`` but not on ``N``.
The pool is joblib's active backend (loky processes on this machine by default): inside
``joblib.parallel_config(backend="dask")`` (with a ``dask.distributed.Client``) or ``backend="ray"`` (after
``ray.util.joblib.register_ray()``) the chunks go to that cluster. A simulator without a generator argument
draws from the process's global streams, which threads share: under a backend of threads
(``backend="threading"``) its chunks run one after another in the calling thread (the same draws).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import numbers
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import torch
from torch import Tensor
from torch.distributions import Distribution, Independent, Normal, Transform, Uniform, biject_to

from ..mechanisms import Mechanism
from ..mechanisms.base import check_exact_integers
from ..seeds import seeded_global_streams
from . import register
from .base import Task, as_summary, discrete_prior_problem, names_problem, prior_problem

Backend = Literal["torch", "numpy"]
BACKENDS = ("torch", "numpy")
#: Prior draws on which the simulator is tried at construction.
PROBE_ROWS = 2
#: Points on which the transform is tried at construction.
TRANSFORM_PROBES = 8
#: Seed of the construction-time probes (they never touch the global random streams).
PROBE_SEED = 20261124
#: Rows per chunk of a simulation call with ``workers=``: each chunk has its own seed and runs in one process.
CHUNK_SIZE = 100


def box(low, high) -> Independent:
    """Independent uniform prior on the box ``[low_1, high_1] x ... x [low_d, high_d]``, event shape ``(d,)``.
    ``low`` and ``high`` are numbers or sequences; a number is repeated to the other's length."""
    low, high = _vectors("box", low=low, high=high)
    if not bool((low < high).all()):
        raise ValueError(
            f"box: need low < high in every coordinate, got low={low.tolist()}, high={high.tolist()}"
        )
    return Independent(Uniform(low, high), 1)


def normal(mean, sd) -> Independent:
    """Independent normal prior ``N(mean_i, sd_i^2)``, event shape ``(d,)``. ``mean`` and ``sd`` are numbers or
    sequences; a number is repeated to the other's length."""
    mean, sd = _vectors("normal", mean=mean, sd=sd)
    if not bool((sd > 0).all()):
        raise ValueError(f"normal: need sd > 0 in every coordinate, got sd={sd.tolist()}")
    return Independent(Normal(mean, sd), 1)


def _vectors(what: str, **values) -> list[Tensor]:
    """``values`` as finite 1-D tensors of torch's default float dtype, broadcast to one length."""
    out = {}
    for key, value in values.items():
        out[key] = torch.atleast_1d(torch.as_tensor(value, dtype=torch.get_default_dtype()))
        if out[key].ndim != 1 or not bool(torch.isfinite(out[key]).all()):
            raise ValueError(f"{what}: {key} must be a finite number or 1-D sequence, got {value!r}")
    try:
        return list(torch.broadcast_tensors(*out.values()))
    except RuntimeError:
        raise ValueError(
            f"{what}: lengths differ: " + ", ".join(f"{k} has {len(v)}" for k, v in out.items())
        ) from None


class UserSimulator:
    """A user's simulator called the way dpsbi calls a task's: ``(theta (n, d) tensor, generator) -> (n, dim_s)``.

    ``fn`` maps ``theta (n, d)`` to summaries ``(n, dim_s)`` (``vectorized``) or one parameter vector ``(d,)``
    to one summary ``(dim_s,)`` (then looped over the rows here), on torch tensors or, with
    ``backend="numpy"``, on float64 numpy arrays; it may return any float dtype (:meth:`Task.simulate`
    converts). Its randomness follows the rule in this module's docstring. With ``workers`` (a number of
    processes, ``-1`` for every core) a call runs in chunks of ``chunk_size`` rows on the CPU, each chunk
    with its own seed, in a joblib pool (:meth:`in_chunks`); ``None``: in this process, in one piece.
    """

    def __init__(
        self,
        fn: Callable,
        backend: Backend = "torch",
        vectorized: bool = True,
        workers: int | None = None,
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        self.fn, self.backend, self.vectorized = fn, backend, bool(vectorized)
        self.workers, self.chunk_size = workers, chunk_size
        self.takes_randomness = takes_randomness(fn)

    def with_backend(self, backend: Backend) -> UserSimulator:
        """The same simulator run with another ``backend``."""
        return UserSimulator(self.fn, backend, self.vectorized, self.workers, self.chunk_size)

    def __call__(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor | np.ndarray:
        if self.workers is not None:
            return self.in_chunks(theta, _seed_from(generator))
        x = theta.detach().cpu().double().numpy() if self.backend == "numpy" else theta
        if not self.takes_randomness:
            with _seeded_global_streams(_seed_from(generator)):
                return self._apply(x, (), theta.device)
        rng = np.random.default_rng(_seed_from(generator)) if self.backend == "numpy" else generator
        return self._apply(x, (rng,), theta.device)

    def in_chunks(self, theta: Tensor, seed: int) -> Tensor:
        """Summaries ``(n, dim_s)`` on ``theta``'s device, simulated on the CPU in chunks of ``chunk_size``
        rows, chunk ``k`` with the ``k``-th seed spawned from ``seed``; the chunks run here when there is
        one worker or one chunk (or the pool's workers are threads and ``fn`` draws from the global streams),
        else in a joblib pool of ``workers`` processes (the same draws)."""
        chunks = theta.detach().cpu().split(self.chunk_size) or (theta.detach().cpu(),)
        seeds = [
            int(child.generate_state(1, np.uint64)[0] >> np.uint64(1))
            for child in np.random.SeedSequence(seed).spawn(len(chunks))
        ]
        dtype = torch.get_default_dtype()
        if self.workers == 1 or len(chunks) == 1 or (not self.takes_randomness and _pool_uses_threads()):
            results = [_run_chunk(self, chunk, chunk_seed, dtype) for chunk, chunk_seed in zip(chunks, seeds)]
        else:
            from joblib import Parallel, delayed

            results = Parallel(n_jobs=self.workers, prefer="processes")(
                delayed(_run_chunk)(self, chunk, chunk_seed, dtype)
                for chunk, chunk_seed in zip(chunks, seeds)
            )
        return torch.cat([as_summary(result, theta.device) for result in results])

    def run_chunk(self, theta: Tensor, seed: int) -> Tensor | np.ndarray:
        """``fn`` on the CPU tensor ``theta`` with randomness seeded by ``seed`` (a generator of the backend's
        kind, or the global streams when ``fn`` takes none)."""
        x = theta.double().numpy() if self.backend == "numpy" else theta
        if not self.takes_randomness:
            with _seeded_global_streams(seed):
                return self._apply(x, (), theta.device)
        rng = np.random.default_rng(seed) if self.backend == "numpy" else torch.Generator().manual_seed(seed)
        return self._apply(x, (rng,), theta.device)

    def _apply(self, x, randomness: tuple, device: torch.device) -> Tensor | np.ndarray:
        """``fn`` on all rows of ``x`` at once, or row by row with the results stacked to ``(n, dim_s)``."""
        if self.vectorized:
            return self.fn(x, *randomness)
        return torch.stack([torch.atleast_1d(as_summary(self.fn(row, *randomness), device)) for row in x])

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        parallel = "" if self.workers is None else f", workers={self.workers}, chunk_size={self.chunk_size}"
        return f"UserSimulator({name}, backend={self.backend!r}, vectorized={self.vectorized}, takes_randomness={self.takes_randomness}{parallel})"


def _run_chunk(simulator: UserSimulator, theta: Tensor, seed: int, dtype: torch.dtype) -> Tensor | np.ndarray:
    """:meth:`UserSimulator.run_chunk` with torch's default dtype set to the caller's ``dtype`` (a worker
    process starts with float32); run here or in a worker process."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return simulator.run_chunk(theta, seed)
    finally:
        torch.set_default_dtype(previous)


def takes_randomness(fn: Callable) -> bool:
    """Whether ``fn`` has a second positional parameter without a default, or defaulting to ``None``: then
    dpsbi passes it the randomness to use."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"cannot read the simulator's signature ({error}); wrap it in a Python function of theta (and rng)"
        ) from None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 and (
        positional[1].default is inspect.Parameter.empty or positional[1].default is None
    )


def _pool_uses_threads() -> bool:
    """Whether joblib's active backend runs its workers as threads of this process."""
    from joblib.parallel import get_active_backend

    backend, _ = get_active_backend(prefer="processes")
    return bool(getattr(backend, "uses_threads", False))


def _seed_from(generator: torch.Generator | None) -> int:
    """A 63-bit seed drawn from ``generator`` (torch's global stream when ``None``)."""
    device = generator.device if generator is not None else torch.get_default_device()
    return int(torch.randint(0, 2**63 - 1, (), generator=generator, device=device))


def _seeded_global_streams(seed: int) -> contextlib.AbstractContextManager[None]:
    """Torch's global streams (the CPU's and every CUDA device's) and numpy's global ``np.random`` stream
    seeded with ``seed`` inside the block, and restored after it (a simulator may start CUDA inside)."""
    return seeded_global_streams(seed, numpy=True, start_cuda=True)


def from_simulator(
    prior: Distribution,
    simulator: Callable | None,
    mechanism: Mechanism,
    y_obs,
    *,
    name: str = "custom",
    parameter_names: Sequence[str] | None = None,
    release_names: Sequence[str] | None = None,
    transform: Transform | None = None,
    true_theta=None,
    vectorized: bool = True,
    backend: Backend | None = None,
    workers: int | None = None,
    chunk_size: int = CHUNK_SIZE,
    description: str = "",
    statistic_bounds=None,
    costly_simulator: bool = False,
) -> Task:
    """A :class:`Task` for your own model, checked before any real simulation.

    - ``prior``: a torch ``Distribution`` over vectors (event shape ``(d,)``), e.g. :func:`box` or :func:`normal`,
      in torch's default float dtype.
    - ``simulator``: the model of the *confidential* summary ``s`` (what the curator adds noise to), not of
      the release: ``theta (n, d) -> s (n, dim_s)`` (``vectorized=True``) or ``theta (d,) -> s (dim_s,)``
      (``vectorized=False``: dpsbi loops over the rows), on torch tensors or, with ``backend="numpy"``,
      float64 numpy arrays; any float dtype out. Its randomness: see this module's docstring (take a second
      argument ``rng`` and draw from it). ``None``: a task without a simulator, whose simulations are handed
      to the estimator (``append_simulations``).
    - ``backend``: ``"torch"`` or ``"numpy"``; left out, ``"torch"`` unless the simulator fails on torch
      tensors and a ``torch.Generator`` but works on float64 arrays and a ``numpy.random.Generator``.
    - ``workers``: simulate in that many processes (``-1``: every core), in chunks of ``chunk_size`` rows with
      a seed each, so that the draws do not depend on ``workers`` (see this module's docstring for Dask and
      Ray); the simulator must then be picklable (joblib's cloudpickle: a module-level function is safest).
    - ``mechanism``: the curator's mechanism, e.g. ``dpsbi.mechanisms.Laplace(epsilon, sensitivity, dim)``
      (L1 sensitivity of the whole statistic) or ``Gaussian(epsilon, delta, sensitivity, dim)`` (L2); see
      this module's docstring for the arithmetic of a clamped mean. The task's ``epsilon`` is the
      mechanism's (its target epsilon for ``BinomialCurve``): epsilon is stated once.
    - ``y_obs``: the observed release, ``(dim_s,)`` or ``(1, dim_s)`` (a number when ``dim_s`` is 1); ``None``
      for an amortized posterior only.
    - ``transform``: a bijection from ``R^k`` onto the prior's support for the flows (default
      ``biject_to(prior.support)``); ``true_theta``: the parameter that made ``y_obs``, where known
      (simulation studies); ``parameter_names``: one per coordinate (default ``theta_1..theta_d``);
      ``release_names``: one per coordinate of the release (default ``y0..y{dim_s - 1}``), the column names of
      ``dpsbi-sample --releases`` and the coordinates its warnings name.
    - ``statistic_bounds``: ``(low, high)``, the range of the statistic behind each release coordinate where
      the data's bounds give one (a clamped mean's ``[a, b]``, a proportion's ``[0, 1]``, a count's
      ``[0, inf]``); a simulated statistic outside it is an error. With Laplace noise, posterior flows clamp
      releases to it, which changes no exact posterior and spares the flow releases it has never seen
      (:meth:`Task.release_bounds`).
    - ``costly_simulator``: ``True`` where one simulation costs about a millisecond or more (an ODE solve, an
      agent-based model): an amortized SPPE fit then draws 100 000 simulations by default instead of up to a
      million (:attr:`Task.costly_simulator`).

    Every input is checked at once and a ``ValueError`` lists each problem on its own line: a release of
    the wrong length, with NaN/inf or outside the mechanism's support; a prior that is not over vectors, is
    discrete, or whose log density is NaN/inf at one of its own draws; a transform whose image is not the prior's support; a ``true_theta`` outside it; a simulator that fails
    or returns the wrong shape or NaN/inf on :data:`PROBE_ROWS` prior draws. A simulator that does not
    reproduce its output from the same generator gets a warning (seeded runs and resumed checkpoints
    then cannot be reproduced). A posterior saved for this task loads with ``load_posterior(path, task=task)``.
    """
    problems = _prior_problems(prior)
    prior_usable = not problems
    if not isinstance(mechanism, Mechanism):
        problems.append(
            f"mechanism must be a dpsbi mechanism (dpsbi.mechanisms.Laplace, Gaussian, ...), got {type(mechanism).__name__}"
        )
    elif y_obs is not None:
        y_obs = _take(problems, _release(y_obs, mechanism))
    if simulator is not None:
        simulator = _take(problems, _wrap(simulator, backend, vectorized, workers, chunk_size))
    if prior_usable:  # the checks that draw from the prior
        transform = biject_to(prior.support) if transform is None else transform
        parameter_names = (
            [f"theta_{i + 1}" for i in range(prior.event_shape[0])]
            if parameter_names is None
            else list(parameter_names)
        )
        with seeded_global_streams(PROBE_SEED):
            problems += _transform_problems(transform, prior)
            true_theta = None if true_theta is None else _take(problems, _theta(true_theta, prior))
            problems += [names_problem("parameter_names", parameter_names, prior.event_shape[0])]
            if isinstance(simulator, UserSimulator) and isinstance(mechanism, Mechanism):
                simulator = _take(
                    problems, _probe_simulator(simulator, prior, mechanism, name, guess=backend is None)
                )
    if isinstance(mechanism, Mechanism) and release_names is not None:
        problems.append(names_problem("release_names", release_names, mechanism.dim))
    problems = [p for p in problems if p]
    if problems:
        raise ValueError(_report(name, problems))
    return Task(
        name=name,
        prior=prior,
        simulator=simulator,
        mechanism=mechanism,
        epsilon=float(getattr(mechanism, "target_epsilon", mechanism.epsilon)),
        y_obs=y_obs,
        true_theta=true_theta,
        transform=transform,
        parameter_names=parameter_names,
        description=description,
        release_names=list(release_names or []),
        statistic_bounds=statistic_bounds,
        costly_simulator=bool(costly_simulator),
    )


def _take(problems: list[str], checked: tuple[object, str | None]):
    """The value of a ``(value, problem)`` check, after adding its problem (if any) to ``problems``."""
    value, problem = checked
    if problem:
        problems.append(problem)
    return value


def _wrap(
    simulator, backend: str | None, vectorized: bool, workers, chunk_size
) -> tuple[UserSimulator | None, str | None]:
    """``simulator`` as a :class:`UserSimulator` (``backend`` ``None``: torch, for now), or the problem with
    it, ``backend``, ``workers`` or ``chunk_size``."""
    if backend is not None and backend not in BACKENDS:
        return None, f"backend must be one of {BACKENDS}, got {backend!r}"
    if not callable(simulator):
        return None, f"simulator must be a function of theta (and rng), got {type(simulator).__name__}"
    if workers is not None and (
        not isinstance(workers, numbers.Integral)
        or isinstance(workers, bool)
        or not (workers >= 1 or workers == -1)
    ):
        return None, f"workers must be a positive integer or -1 (every core), got {workers!r}"
    if not isinstance(chunk_size, numbers.Integral) or isinstance(chunk_size, bool) or chunk_size < 1:
        return None, f"chunk_size must be a positive integer, got {chunk_size!r}"
    if workers not in (None, 1):
        try:
            import cloudpickle  # what joblib's process pools send functions with
        except ImportError:  # joblib < 1.5 vendored it
            from joblib.externals import cloudpickle
        try:
            cloudpickle.dumps(simulator)
        except Exception as error:  # anything that cannot be pickled, in any way
            return None, (
                f"workers={workers}: the simulator cannot be sent to worker processes ({type(error).__name__}: "
                f"{error}); define it as a module-level function, or leave workers out"
            )
    try:
        return UserSimulator(
            simulator,
            backend or "torch",
            vectorized,
            None if workers is None else int(workers),
            int(chunk_size),
        ), None
    except ValueError as error:
        return None, str(error)


def _show(t: Tensor) -> list[float]:
    """The values of ``t`` rounded to 4 significant digits, for messages."""
    return [float(f"{v:.4g}") for v in t.flatten().tolist()]


def _report(name: str, problems: list[str]) -> str:
    """One line per problem under a heading naming the task."""
    if len(problems) == 1:
        return f"task {name!r}: {problems[0]}"
    return f"task {name!r} has {len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)


def _prior_problems(prior) -> list[str]:
    """What keeps ``prior`` from being a task's prior (empty when usable)."""
    if not isinstance(prior, Distribution):
        return [
            f"prior must be a torch Distribution (dpsbi.tasks.box and normal build common ones), got {type(prior).__name__}"
        ]
    discrete = discrete_prior_problem(prior)
    if discrete:
        return [discrete]
    if len(prior.event_shape) != 1:
        return [
            f"prior must be over vectors (event shape (d,)), got event shape {tuple(prior.event_shape)}; "
            "wrap it as torch.distributions.Independent(prior, 1) or use dpsbi.tasks.box / normal"
        ]
    try:
        mean = prior.mean
    except NotImplementedError:
        return [f"prior {type(prior).__name__} must define .mean (dpsbi reads its device from it)"]
    if mean.dtype != torch.get_default_dtype():
        return [
            f"prior is in {mean.dtype} but torch's default dtype is {torch.get_default_dtype()}; build it from {torch.get_default_dtype()} tensors"
        ]
    return []


def _release(y_obs, mechanism: Mechanism) -> tuple[Tensor | None, str | None]:
    """``y_obs`` as a ``(1, dim_s)`` tensor in the mechanism's dtype, or the problem with it (length, NaN/inf,
    outside the support, counts beyond what its dtype holds exactly)."""
    y, problem = _numbers(y_obs, "y_obs", mechanism.dtype)
    if problem:
        return None, problem
    y = y.reshape(1, -1) if y.ndim == 1 or (y.ndim == 0 and mechanism.dim == 1) else y
    if y.ndim != 2 or y.shape[0] != 1:
        return (
            None,
            f"y_obs must be one release, of shape ({mechanism.dim},) or (1, {mechanism.dim}); got shape {tuple(y.shape)}",
        )
    if y.shape[1] != mechanism.dim:
        return (
            None,
            f"y_obs has {y.shape[1]} values but the mechanism releases {mechanism.dim}: {mechanism!r}",
        )
    bad = (~torch.isfinite(y[0])).nonzero().flatten().tolist()
    if bad:
        return None, f"y_obs holds NaN/inf at positions {bad}: {_show(y[0])}"
    if not bool(mechanism.in_support(y).all()):
        return (
            None,
            f"y_obs {_show(y[0])} lies outside the support of {mechanism!r} (it cannot be a release of it)",
        )
    return y, None


def _numbers(value, what: str, dtype: torch.dtype | None = None) -> tuple[Tensor | None, str | None]:
    """``value`` (tensor, array, sequence) as a tensor of ``dtype`` (default: torch's default float dtype), read
    through float64 so that counts stay exact up to 2^53 where ``dtype`` is float64; or the problem."""
    if dtype == torch.float64 and torch.is_tensor(value):
        try:
            check_exact_integers(what, value)
        except ValueError as error:
            return None, str(error)
    try:
        return torch.as_tensor(value, dtype=torch.float64).to(dtype or torch.get_default_dtype()), None
    except (TypeError, ValueError, RuntimeError) as error:
        return None, f"{what} must be numbers, got {value!r} ({error})"


def _inside(prior: Distribution, theta: Tensor) -> Tensor:
    """Whether each row of ``theta (n, d)`` lies in the prior's support (and is finite): ``(n,)``."""
    inside = prior.support.check(theta)
    inside = inside.all(-1) if inside.ndim == theta.ndim else inside
    return inside & torch.isfinite(theta).all(-1)


def _theta(true_theta, prior: Distribution) -> tuple[Tensor | None, str | None]:
    """``true_theta`` as a ``(1, d)`` tensor on the prior's device, or the problem with it."""
    d = prior.event_shape[0]
    theta, problem = _numbers(true_theta, "true_theta")
    if problem:
        return None, problem
    theta = theta.to(prior.mean.device)
    theta = theta.reshape(1, -1) if theta.ndim == 1 else theta
    if theta.shape != (1, d):
        return None, f"true_theta must have shape ({d},) or (1, {d}), got {tuple(theta.shape)}"
    if not bool(_inside(prior, theta).all()):
        return None, f"true_theta {_show(theta[0])} lies outside the prior's support {prior.support}"
    return theta, None


def _transform_problems(transform, prior: Distribution) -> list[str]:
    """Problems of ``transform`` as a bijection from ``R^k`` onto the prior's support, found on
    :data:`TRANSFORM_PROBES` standard-normal points, and of the prior with it on its own draws
    (:func:`~dpsbi.tasks.base.prior_problem`: a log density that is not finite, a draw not mapped back)."""
    if not isinstance(transform, Transform):
        return [
            f"transform must be a torch.distributions Transform from R^k onto the prior's support, got {type(transform).__name__}"
        ]
    d = prior.event_shape[0]
    try:
        z = torch.randn(
            (TRANSFORM_PROBES, *transform.inv.forward_shape(prior.event_shape)), device=prior.mean.device
        )
        image = transform(z)
        if image.shape != (TRANSFORM_PROBES, d):
            return [
                f"transform {transform} maps points of shape {tuple(z.shape[1:])} to shape {tuple(image.shape[1:])}, but the prior's draws have shape ({d},)"
            ]
        outside = ~_inside(prior, image)
        if outside.any():
            return [
                f"transform {transform} maps z={_show(z[outside][0])} to {_show(image[outside][0])}, outside the prior's support {prior.support}: its image is not the support"
            ]
    except Exception as error:  # a user's transform may fail in any way: report it as one line
        return [f"transform {transform} fails on probe points: {type(error).__name__}: {error}"]
    try:
        problem = prior_problem(prior, transform)
    except Exception as error:  # a user's prior or transform may fail in any way: one line
        return [
            f"the prior {type(prior).__name__} or transform {transform} fails on the prior's own draws: {type(error).__name__}: {error}"
        ]
    return [problem] if problem else []


def _probe_simulator(
    simulator: UserSimulator, prior: Distribution, mechanism: Mechanism, name: str, guess: bool
) -> tuple[UserSimulator | None, str | None]:
    """``simulator`` tried on :data:`PROBE_ROWS` prior draws, or the problem: failure, shape, NaN/inf. With
    ``guess`` (no backend stated), a simulator that fails on torch tensors is tried as a numpy one and kept
    as such when that works. Warns if a second call with the same generator seed gives other summaries (not
    reproducible)."""
    theta = prior.sample((PROBE_ROWS,))

    def run(simulator: UserSimulator) -> Tensor:
        return as_summary(
            simulator(theta, torch.Generator(device=theta.device).manual_seed(PROBE_SEED)), theta.device
        )

    def failure(error: Exception) -> str:
        return f"{type(error).__name__}: {error}"

    try:
        s = run(simulator)
    except Exception as error:  # a user's simulator may fail in any way: report it as one line
        problem = f"simulator fails on {PROBE_ROWS} prior draws {_show(theta)}: {failure(error)}"
        if not guess:
            return None, problem
        try:
            simulator = simulator.with_backend("numpy")
            s = run(simulator)
        except Exception as numpy_error:  # a numpy simulator with a bug, or no numpy simulator at all
            # numpy code handed torch objects fails with these (e.g. "'torch._C.Generator' object has no
            # attribute 'normal'"): then the numpy attempt's error is the one that helps
            if isinstance(error, (AttributeError, TypeError)) and failure(numpy_error) != failure(error):
                problem += f'; as a numpy simulator (backend="numpy") it fails too: {failure(numpy_error)}'
            return None, problem
    problem = _summary_problem(simulator, theta, s, mechanism)
    if problem:
        return None, problem
    if not torch.allclose(run(simulator), s, rtol=1e-5, atol=1e-8, equal_nan=True):
        warnings.warn(
            f"task {name!r}: the simulator gives other summaries for the same generator seed, so seeded runs and "
            "resumed checkpoints cannot be reproduced; draw all randomness from its second argument (rng)",
            stacklevel=3,
        )
    return simulator, None


def _summary_problem(simulator: UserSimulator, theta: Tensor, s: Tensor, mechanism: Mechanism) -> str | None:
    """The problem of the summaries ``s`` that ``simulator`` returned for the probe draws ``theta``: shape,
    NaN/inf (``None`` when fine)."""
    expected = (PROBE_ROWS, mechanism.input_dim)
    if s.shape != expected:
        per_row = "" if simulator.vectorized else " (stacked from one row per parameter vector)"
        return f"simulator returned shape {tuple(s.shape)}{per_row} for {PROBE_ROWS} prior draws, expected {expected}: one summary of {mechanism.input_dim} values per row"
    bad = ~torch.isfinite(s).all(-1)
    if bad.any():
        row = int(bad.nonzero()[0])
        return f"simulator returned NaN/inf {_show(s[row])} at the prior draw theta={_show(theta[row])}"
    return None


# ---- a user's task by import path: the registered task "custom" ------------------------------------------------
def import_factory(path: str) -> Callable[..., Task]:
    """The function named by ``"module:function"`` (``module`` may be dotted), or a ``ValueError`` saying
    what could not be found where."""
    module_name, colon, name = path.partition(":")
    if not colon or not module_name or not name:
        raise ValueError(f"task.factory must be 'module:function', got {path!r}")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ValueError(
            f"task.factory {path!r}: cannot import {module_name!r} from {cwd} or the installed packages ({error})"
        ) from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(
            f"task.factory {path!r}: module {module_name!r} ({module.__file__}) has no function {name!r}"
        )
    return factory


@register("custom")
def make(factory: str | None = None, **kwargs) -> Task:
    """The task returned by ``factory(**kwargs)`` (keywords that are ``None`` left out, so a config may list
    ``epsilon: null``). The factory is a function returning a :class:`~dpsbi.tasks.base.Task` (usually built
    with :func:`from_simulator`), imported from the current working directory first, then from the installed
    packages (:func:`import_factory`). Posterior files record the import path and the arguments, so that
    ``load_posterior`` and ``dpsbi-sample`` rebuild the task the same way (from the same working directory)."""
    if not factory:
        raise ValueError(
            "task 'custom' needs factory='module:function' (on the command line: task.factory=mymodel:make_task)"
        )
    task = import_factory(factory)(**{k: v for k, v in kwargs.items() if v is not None})
    if not isinstance(task, Task):
        raise ValueError(f"task.factory {factory!r} returned a {type(task).__name__}, not a dpsbi Task")
    return task
