"""ABCDP (Park, Vinaroz & Jitkrittum 2021): rejection ABC made differentially private by the sparse vector
technique (SVT).

The data holder compares each public proposal's simulated data with the confidential data through a
distance ``rho`` of sensitivity ``Delta`` (the most ``rho`` can move when one record changes), and answers
only "below the threshold or not": ``rho_t + Lap(2b) <= epsilon_abc + Lap(b)``. The threshold noise is drawn
once (``resample=False``) or again after every acceptance (``resample=True``), and the algorithm stops after
``c`` acceptances. The accepted parameters are ``epsilon_total``-DP with (Theorem 1)

    epsilon_total = (c + 1) Delta / b   (resample=False),      2 c Delta / b   (resample=True).

The probability that ABCDP's answer differs from plain rejection ABC's (Proposition 1) is
``G_b(|rho_t - epsilon_abc|)`` with ``G_b(a) = (4 exp(-a / 2b) - exp(-a / b)) / 6``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from torch import Tensor
from torch.distributions import Distribution
from tqdm.auto import tqdm

from ..mechanisms import Gaussian, Laplace
from ..mechanisms.base import check_integer
from ..seeds import seeded_global_streams
from ..tasks import Task
from .result import BaselineResult

Distance = Callable[[Tensor, Tensor], Tensor]
Simulator = Callable[[Tensor, "torch.Generator | None"], Tensor]


def _composition_factor(num_accepted: int, resample: bool) -> int:
    """How many multiples of ``Delta / b`` Theorem 1 charges: ``2c`` with RESAMPLE, ``c + 1`` without."""
    num_accepted = check_integer("the number of accepted samples c", num_accepted)
    return 2 * num_accepted if resample else num_accepted + 1


def abcdp_epsilon(num_accepted: int, sensitivity: float, noise_scale: float, resample: bool) -> float:
    """Theorem 1: privacy loss of ``c = num_accepted`` acceptances with threshold noise ``Lap(noise_scale)``
    and distance noise ``Lap(2 noise_scale)``; ``inf`` when ``noise_scale`` is 0 (no privacy)."""
    if not sensitivity > 0 or not noise_scale >= 0:
        raise ValueError(f"need sensitivity > 0 and noise_scale >= 0, got {sensitivity} and {noise_scale}")
    factor = _composition_factor(num_accepted, resample)
    return math.inf if noise_scale == 0 else factor * sensitivity / noise_scale


def abcdp_noise_scale(epsilon_total: float, num_accepted: int, sensitivity: float, resample: bool) -> float:
    """The threshold-noise scale ``b`` at which ``c`` acceptances cost ``epsilon_total`` (Theorem 1 inverted);
    0 for ``epsilon_total = inf`` (plain rejection ABC)."""
    if not epsilon_total > 0 or not sensitivity > 0:
        raise ValueError(f"need epsilon_total > 0 and sensitivity > 0, got {epsilon_total} and {sensitivity}")
    return _composition_factor(num_accepted, resample) * sensitivity / epsilon_total


def flip_probability(distance: Tensor, epsilon_abc: float, noise_scale: float) -> Tensor:
    """Proposition 1: probability that ABCDP's answer for a proposal at ``distance`` (any shape) differs from
    rejection ABC's answer ``distance <= epsilon_abc``: ``G_b(|distance - epsilon_abc|)``, same shape
    (zeros for ``noise_scale = 0``: without noise nothing flips)."""
    gap = (torch.as_tensor(distance) - epsilon_abc).abs()
    if noise_scale == 0:
        return torch.zeros_like(gap)
    return (4 * torch.exp(-gap / (2 * noise_scale)) - torch.exp(-gap / noise_scale)) / 6


def gaussian_mmd(observed: Tensor, simulated: Tensor, bandwidth: float) -> Tensor:
    """MMD (the RKHS norm, not squared; biased V-statistic) of the Gaussian kernel
    ``exp(-|x - x'|^2 / (2 bandwidth^2))`` between the dataset ``observed (N, d)`` and each dataset of
    ``simulated (B, M, d)``; shape ``(B,)``. Its sensitivity to one observed record is :func:`mmd_sensitivity`."""
    if observed.ndim != 2 or simulated.ndim != 3 or simulated.shape[-1] != observed.shape[-1]:
        raise ValueError(
            "gaussian_mmd needs observed (N, d) and simulated (B, M, d), "
            f"got {tuple(observed.shape)} and {tuple(simulated.shape)}"
        )

    def mean_kernel(a: Tensor, b: Tensor) -> Tensor:
        return torch.exp(-torch.cdist(a, b).square() / (2 * bandwidth**2)).mean((-2, -1))

    observed = observed.to(simulated)
    cross = mean_kernel(observed[None], simulated)
    squared = mean_kernel(observed, observed) + mean_kernel(simulated, simulated) - 2 * cross
    return squared.clamp(min=0).sqrt()


def mmd_sensitivity(num_observations: int, kernel_bound: float = 1.0) -> float:
    """Lemma 1: the MMD of a kernel bounded by ``kernel_bound`` moves by at most ``2 sqrt(B_k) / N`` when
    one of the ``N`` observed records is replaced."""
    return 2.0 * math.sqrt(kernel_bound) / num_observations


def _laplace(scale: float, shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None) -> Tensor:
    """``Lap(scale)`` noise of ``shape`` on ``like``'s device and dtype. The uniforms are drawn even when
    ``scale`` is 0, so that runs at different budgets with one seed share their proposals."""
    unit = Laplace(1.0, sensitivity=1.0).sample(like.new_zeros(shape + (1,)), generator=generator)[..., 0]
    return scale * unit


class SparseVector:
    """The sequential state of Algorithm 1: the noisy threshold and the number of acceptances so far.

    Calling it on a chunk of distances ``(n,)`` (the next proposals, in order) returns the indicators
    ``(n,)`` and how many of the chunk's proposals were answered before the ``c``-th acceptance stopped it.
    Noise is drawn for the whole chunk at once; the loop runs over acceptances, not proposals.
    """

    def __init__(
        self,
        epsilon_abc: float,
        noise_scale: float,
        num_accepted: int,
        resample: bool,
        generator: torch.Generator | None = None,
    ) -> None:
        _composition_factor(num_accepted, resample)  # validates c
        self.epsilon_abc, self.noise_scale = float(epsilon_abc), float(noise_scale)
        self.num_accepted, self.resample, self.generator = int(num_accepted), bool(resample), generator
        self.count = 0
        self._threshold: Tensor | None = None

    @property
    def done(self) -> bool:
        """Whether ``c`` proposals have been accepted."""
        return self.count >= self.num_accepted

    def _draw_threshold(self, like: Tensor) -> None:
        self._threshold = self.epsilon_abc + _laplace(self.noise_scale, (), like, self.generator)

    def __call__(self, distances: Tensor) -> tuple[Tensor, int]:
        if distances.ndim != 1:
            raise ValueError(
                f"distances must be a 1-d chunk of the proposal stream, got shape {tuple(distances.shape)}"
            )
        if self._threshold is None:
            self._draw_threshold(distances)
        noisy = distances + _laplace(2 * self.noise_scale, tuple(distances.shape), distances, self.generator)
        accepted = torch.zeros_like(distances, dtype=torch.bool)
        start = 0
        while not self.done:
            hits = (noisy[start:] <= self._threshold).nonzero().flatten() + start
            if hits.numel() == 0:
                break
            take = hits[: 1 if self.resample else self.num_accepted - self.count]
            accepted[take] = True
            self.count += take.numel()
            start = int(take[-1]) + 1
            if self.resample:
                self._draw_threshold(distances)
        return accepted, start if self.done else distances.shape[0]


def sample_prior(prior: Distribution, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
    """``prior.sample((num_samples,))``, reproducible from ``generator`` (torch distributions take none: the
    global RNG is seeded from ``generator`` inside a fork, so the caller's global state is untouched)."""
    if generator is None:
        return prior.sample((num_samples,))
    seed = int(torch.randint(0, 2**62, (), generator=generator))
    with seeded_global_streams(seed):
        return prior.sample((num_samples,))


def _summary_distance(task: Task) -> tuple[Distance, float] | tuple[None, None]:
    """The distance between summaries that matches the sensitivity of the task's mechanism: L1 for Laplace
    (L1 sensitivity), L2 for Gaussian (L2 sensitivity); by the reverse triangle inequality its sensitivity
    is the mechanism's. ``(None, None)`` for other mechanisms."""
    norm = next((p for kind, p in [(Laplace, 1), (Gaussian, 2)] if isinstance(task.mechanism, kind)), None)
    if norm is None:
        return None, None
    return (
        lambda observed, s: torch.linalg.vector_norm(s - observed, ord=norm, dim=-1)
    ), task.mechanism.sensitivity


def abcdp(
    task_or_data: Task | Tensor,
    num_accepted: int,
    epsilon_total: float,
    epsilon_abc: float,
    *,
    resample: bool = False,
    max_proposals: int = 100_000,
    batch_size: int = 1000,
    prior: Distribution | None = None,
    simulator: Simulator | None = None,
    distance: Distance | None = None,
    sensitivity: float | None = None,
    clip: float | None = None,
    generator: torch.Generator | None = None,
    progress: bool = True,
) -> BaselineResult:
    """ABCDP (Algorithm 1): up to ``num_accepted`` (the SVT's ``c``) prior draws whose private distance test
    passed, ``epsilon_total``-DP for the confidential data (``epsilon_total = inf``: plain rejection ABC).

    ``task_or_data`` is either

    - a :class:`~dpsbi.tasks.Task` holding its confidential summary ``s_obs`` (ABCDP runs on the data
      holder's side and ignores ``y_obs``): proposals come from ``task.prior`` and ``task.simulate``, and by
      default ``rho`` is the L1 (Laplace tasks) or L2 (Gaussian tasks) distance between summaries, whose
      sensitivity is the mechanism's (for ``uniform_mixture`` that is the kernel MMD, ``Delta = 2 / n_obs``);
    - or the confidential data themselves, with ``prior``, ``simulator(theta (n, d), generator)`` -> simulated
      data (batch first) and ``distance(observed, simulated) -> (n,)``, e.g.
      ``functools.partial(gaussian_mmd, bandwidth=l)`` with ``sensitivity=mmd_sensitivity(N)``.

    ``sensitivity`` overrides the distance's; ``clip`` uses ``min(rho, clip)``, whose sensitivity is at most
    ``clip`` (for distances without a bounded sensitivity). Proposals are simulated ``batch_size`` at a time,
    at most ``max_proposals`` of them.

    Returns the accepted draws ``(k, dim_theta)``, ``k <= num_accepted`` (a warning when fewer), with ``info``:
    ``epsilon_total`` (Theorem 1), ``noise_scale`` b, ``sensitivity``, ``accepted``, ``proposals`` (answered by
    the SVT), ``flips`` (answers that differ from rejection ABC's) and ``expected_flips`` (sum of the
    Proposition 1 probabilities; the expected number of flips for ``resample=False``, where each answer's
    threshold noise is marginally ``Lap(b)``). The draws, ``accepted`` and ``proposals`` are functions of the
    private answers; ``flips`` and ``expected_flips`` use the exact distances and are NOT private: they are
    diagnostics for the data holder.
    """
    problem = _problem(task_or_data, prior, simulator, distance, sensitivity)
    observed, prior, simulator, distance, sensitivity = problem
    if clip is not None:
        if not clip > 0:
            raise ValueError(f"clip must be > 0, got {clip}")
        sensitivity = clip if sensitivity is None else min(sensitivity, clip)
    if sensitivity is None:
        raise ValueError("the distance has no known sensitivity: pass sensitivity=<bound> or clip=<C>")
    max_proposals, batch_size = (
        check_integer("max_proposals", max_proposals),
        check_integer("batch_size", batch_size),
    )
    noise_scale = abcdp_noise_scale(epsilon_total, num_accepted, sensitivity, resample)
    svt = SparseVector(epsilon_abc, noise_scale, num_accepted, resample, generator)
    draws, proposals, simulations, flips, expected_flips = [], 0, 0, 0, 0.0
    with tqdm(total=max_proposals, desc="ABCDP proposals", disable=not progress) as bar:
        while not svt.done and proposals < max_proposals:
            theta = sample_prior(prior, min(batch_size, max_proposals - proposals), generator)
            rho = distance(observed, simulator(theta, generator))
            if rho.shape != theta.shape[:1]:
                raise ValueError(
                    f"distance must return one value per proposal, ({theta.shape[0]},), got {tuple(rho.shape)}"
                )
            if clip is not None:
                rho = rho.clamp(max=clip)
            accepted, answered = svt(rho)
            draws.append(theta[accepted])
            simulations += theta.shape[0]
            proposals += answered
            flips += int(((rho[:answered] <= epsilon_abc) != accepted[:answered]).sum())
            expected_flips += float(flip_probability(rho[:answered], epsilon_abc, noise_scale).sum())
            bar.update(answered)
            bar.set_postfix(accepted=svt.count)
    if not svt.done:
        warnings.warn(
            f"ABCDP accepted {svt.count} of the {num_accepted} requested draws within {max_proposals} proposals",
            stacklevel=2,
        )
    info = dict(
        epsilon_total=abcdp_epsilon(num_accepted, sensitivity, noise_scale, resample),
        noise_scale=noise_scale,
        sensitivity=sensitivity,
        epsilon_abc=float(epsilon_abc),
        resample=bool(resample),
        accepted=svt.count,
        proposals=proposals,
        flips=flips,
        expected_flips=expected_flips,
    )
    return BaselineResult(torch.cat(draws), num_simulations=simulations, info=info)


def _problem(
    task_or_data: Task | Tensor,
    prior: Distribution | None,
    simulator: Simulator | None,
    distance: Distance | None,
    sensitivity: float | None,
) -> tuple[Tensor, Distribution, Simulator, Distance, float | None]:
    """``(observed, prior, simulator, distance, sensitivity)`` from a task or from data plus callables."""
    if isinstance(task_or_data, Task):
        task = task_or_data
        if task.s_obs is None:
            raise ValueError(
                f"ABCDP thresholds the distance to the confidential data, but task {task.name!r} holds only a "
                "release (s_obs is None); build it with y_obs='simulate' or pass the data themselves"
            )
        if distance is None:
            distance, default_sensitivity = _summary_distance(task)
            if distance is None:
                raise ValueError(
                    f"task {task.name!r} uses {task.mechanism!r}: pass distance= and sensitivity= or clip="
                )
            sensitivity = default_sensitivity if sensitivity is None else sensitivity
        return task.s_obs, prior or task.prior, simulator or task.simulate, distance, sensitivity
    if not torch.is_tensor(task_or_data):
        raise TypeError(
            f"abcdp needs a Task or the observed data as a tensor, got {type(task_or_data).__name__}"
        )
    given = {"prior": prior, "simulator": simulator, "distance": distance}
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise ValueError(f"abcdp on raw data needs {', '.join(missing)}")
    return task_or_data, prior, simulator, distance, sensitivity
