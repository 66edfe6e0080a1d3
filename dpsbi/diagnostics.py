"""MCMC diagnostics and the export of posteriors and baseline results to ArviZ, under either major version.

One implementation of the effective sample size and R-hat for every sampler of dpsbi: ArviZ's (Vehtari,
Gelman, Simpson, Carpenter & Burkner 2021), i.e. the rank-normalized split R-hat (the larger of the bulk and
the folded-tail value) and the bulk and tail effective sample sizes, with their autocorrelations pooled over
the chains and truncated by Geyer's initial monotone sequence.

Layout: chains are ``(C, T, d)`` (chain, draw, parameter), ArviZ's order, or ``(C, T)`` for one quantity.

The conversions (:func:`posterior_inference_data`, :func:`baseline_inference_data`, behind
``Posterior.to_arviz`` and ``BaselineResult.to_arviz``) name the posterior's variables after the task's
parameters (each of dims ``(chain, draw)``), keep an MCMC sampler's chains as chains, put the release in
``observed_data`` (and, if asked, releases simulated from every draw in ``posterior_predictive``, both as the
variable ``release`` of dim ``release_dim``, the layout ``arviz.plot_ppc`` (1.x: ``plot_ppc_dist``) reads),
and record the method, the task, epsilon, the release and the settings as attributes of every group (plain
numbers, strings and lists, with the settings as a JSON string, so that ``to_netcdf`` can write them).

Both ArviZ majors, through one code path: ArviZ 0.x (Python 3.11, and on any Python with
``arviz<1``) gets an ``arviz.InferenceData``, ArviZ 1.x (which pip installs on Python >= 3.12) an xarray
``DataTree``, with the same groups, variables, dims, coordinates and dpsbi attributes; only the call of
``from_dict`` differs (:func:`arviz_major`, read once from ``arviz.__version__``). Either is written by
``to_netcdf`` and read back by ``arviz.from_netcdf``; ``data["posterior"]`` is the posterior group in both.

ArviZ is imported on first use (it takes seconds), with ArviZ 0.x's notice about the coming refactor silenced.
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

#: Fewest draws per chain for an effective sample size: ArviZ splits every chain in two, and on halves of
#: fewer than 5 draws Geyer's sequence never starts, so that ArviZ returns its upper bound ``n log10 n``
#: whatever the chains (500 chains of 4 independent draws: 6602 for 2000 draws). Shorter chains get NaN.
#: Even at 10 to 20 draws a chain, ArviZ's estimate runs high (by ~20-50% on independent draws).
MIN_ESS_DRAWS = 10
#: Fewest draws per chain (and 2 chains) for R-hat, as ArviZ asks.
MIN_RHAT_DRAWS = 4
#: Draws per chain of an MCMC posterior (SPLE) diagnosed in a run's summary: enough for ArviZ's ESS
#: (SPLE's 2000 draws for its metrics are 4 per chain of 500).
DRAWS_PER_CHAIN = 20
#: Draws of a posterior exported by ``to_arviz`` without ``num_samples`` (an MCMC posterior: in
#: :func:`export_chains` chains).
EXPORT_DRAWS = 4000
#: Quantiles whose effective sample sizes make the tail ESS (ArviZ 0.x's default; ArviZ 1.x asks for them).
TAIL_PROB = (0.05, 0.95)


def _arviz():
    """The ``arviz`` module, imported without its FutureWarning about the coming 1.0 refactor."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz

    return arviz


@functools.cache
def arviz_major() -> int:
    """The installed ArviZ's major version: 0 (``from_dict(posterior=...)`` gives an ``InferenceData``) or 1
    (``from_dict({"posterior": ...})`` gives an xarray ``DataTree``)."""
    return int(str(_arviz().__version__).split(".")[0])


def _as_chains(chains) -> tuple[np.ndarray, bool]:
    """``chains`` ((C, T, d) or (C, T), tensor or array) as a float64 array ``(C, T, d)``, and whether it was 2-D."""
    x = torch.as_tensor(chains).detach().cpu().double().numpy()
    if x.ndim not in (2, 3):
        raise ValueError(
            f"chains must have shape (chains, draws, dim) or (chains, draws), got {tuple(x.shape)}"
        )
    return (x[..., None], True) if x.ndim == 2 else (x, False)


def _per_coordinate(fn, chains) -> Tensor:
    x, squeeze = _as_chains(chains)
    values = torch.tensor([float(fn(x[..., j])) for j in range(x.shape[-1])], dtype=torch.float64)
    return values[0] if squeeze else values


def ess(chains, method: str = "bulk") -> Tensor:
    """Effective sample size per coordinate of ``chains (C, T, d)`` (``(C, T)``: a scalar), float64: ArviZ's
    ``arviz.ess(..., method=method)`` (``"bulk"``: rank-normalized split chains, the default; ``"tail"``:
    the smaller of those of the 5% and 95% quantiles, :data:`TAIL_PROB`; any other method of ``arviz.ess``
    without a ``prob``). The same numbers under ArviZ 0.x and 1.x.
    About ``C T`` for independent draws, up to ``C T log10(C T)`` for antithetic ones; NaN with fewer than
    :data:`MIN_ESS_DRAWS` draws per chain (where ArviZ's estimate is meaningless) or a NaN draw."""
    az = _arviz()
    x, _ = _as_chains(chains)
    if x.shape[1] < MIN_ESS_DRAWS:
        return _per_coordinate(lambda _: math.nan, chains)
    prob = {"prob": TAIL_PROB} if method == "tail" else {}
    return _per_coordinate(lambda a: az.ess(a, method=method, **prob), chains)


def rhat(chains) -> Tensor:
    """Rank-normalized split R-hat per coordinate of ``chains (C, T, d)`` (``(C, T)``: a scalar), float64:
    ArviZ's ``arviz.rhat(..., method="rank")``, the larger of the bulk and folded-tail values. Near 1 when the
    chains agree (1.01 is Vehtari et al.'s threshold for trusting them), above while they still remember
    their starting points or mix slowly for their length. NaN for a single chain (R-hat compares chains:
    ArviZ does not split one into two) or fewer than :data:`MIN_RHAT_DRAWS` draws per chain."""
    az = _arviz()
    x, _ = _as_chains(chains)
    if x.shape[0] < 2 or x.shape[1] < MIN_RHAT_DRAWS:
        return _per_coordinate(lambda _: math.nan, chains)
    return _per_coordinate(lambda a: az.rhat(a, method="rank"), chains)


def integrated_autocorrelation_time(chains) -> Tensor:
    """``C T / ess(chains)`` per coordinate: the integrated autocorrelation time that the bulk effective sample
    size implies (the variance of the mean of ``n`` draws is ``tau Var / n``)."""
    x, _ = _as_chains(chains)
    return x.shape[0] * x.shape[1] / ess(chains)


def chain_diagnostics(chains) -> dict[str, Tensor]:
    """``ess`` (bulk), ``ess_tail``, ``rhat`` and the implied ``iat``, each ``(d,)`` float64, of ``chains (C, T, d)``."""
    bulk = ess(chains, "bulk")
    x, _ = _as_chains(chains)
    return dict(ess=bulk, ess_tail=ess(chains, "tail"), rhat=rhat(chains), iat=x.shape[0] * x.shape[1] / bulk)


def summary(chains) -> dict[str, float | None]:
    """The run table's columns for ``chains (C, T, d)``: ``rhat`` (the largest over parameters) and ``ess_bulk``
    (the smallest); ``None`` where not defined (one chain; too few draws)."""

    def finite(value: Tensor, reduce) -> float | None:
        value = float(reduce(value)) if value.numel() else math.nan
        return value if math.isfinite(value) else None

    return {"rhat": finite(rhat(chains), torch.max), "ess_bulk": finite(ess(chains), torch.min)}


# ---- ArviZ export ---------------------------------------------------------------------------------------


def parameter_names(task, dim: int | None = None) -> list[str]:
    """The task's parameter names, or ``theta[0]``, ``theta[1]``, ... when it has none (or not ``dim`` of them)."""
    names = list(getattr(task, "parameter_names", None) or []) if task is not None else []
    dim = len(names) if dim is None else dim
    return names if len(names) == dim and len(set(names)) == dim else [f"theta[{i}]" for i in range(dim)]


def simulate_releases(
    task, theta: Tensor, generator: torch.Generator | None = None, epsilon: float | None = None
) -> Tensor:
    """Releases ``(..., dim_s)`` simulated from draws ``theta (..., dim_theta)``: ``task.simulate`` then the
    task's mechanism (re-calibrated at ``epsilon`` when given), one release per draw, on the prior's device."""
    device = task.prior.mean.device
    flat = theta.reshape(-1, theta.shape[-1]).to(device, torch.get_default_dtype())
    mechanism = task.mechanism if epsilon is None else task.mechanism.with_epsilon(epsilon)
    releases = mechanism.sample(task.simulate(flat, generator), generator=generator)
    return releases.reshape(theta.shape[:-1] + (releases.shape[-1],))


def _attribute(value):
    """``value`` as a netCDF attribute: numbers and strings as they are, tensors and sequences as lists of
    numbers, booleans as 0/1, anything else as JSON."""
    if torch.is_tensor(value):
        value = value.detach().cpu().tolist()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        return list(value)
    return json.dumps(value, default=str)


def _flat_release(y) -> list[float]:
    return torch.as_tensor(y).detach().cpu().double().reshape(-1).tolist()


def inference_data(
    chains: Tensor,
    names: Sequence[str],
    attrs: dict | None = None,
    observed: Tensor | None = None,
    predictive: Tensor | None = None,
):
    """ArviZ's data of ``chains (C, T, d)`` (an ``arviz.InferenceData`` under ArviZ 0.x, an xarray ``DataTree``
    under 1.x; the same content): one posterior variable ``(chain, draw)`` per name of ``names``; the release
    ``observed (dim_s,)`` as ``observed_data.release`` ``(release_dim,)`` and simulated releases
    ``predictive (C, T, dim_s)`` as ``posterior_predictive.release`` ``(chain, draw, release_dim)``; ``attrs``
    (values made netCDF-safe, ``None`` left out, with ``inference_library="dpsbi"``) on every group and on the
    whole."""
    x, _ = _as_chains(chains)
    if x.shape[-1] != len(names):
        raise ValueError(f"{len(names)} names for chains of {x.shape[-1]} parameters")
    groups = {"posterior": {name: x[..., j] for j, name in enumerate(names)}}
    if observed is not None:
        groups["observed_data"] = {"release": np.asarray(_flat_release(observed))}
    if predictive is not None:
        groups["posterior_predictive"] = {
            "release": torch.as_tensor(predictive).detach().cpu().double().numpy()
        }
    attrs = {
        k: _attribute(v) for k, v in {"inference_library": "dpsbi", **(attrs or {})}.items() if v is not None
    }
    return _from_dict(groups, attrs, dims={"release": ["release_dim"]})


def _from_dict(groups: dict[str, dict[str, np.ndarray]], attrs: dict, dims: dict[str, list[str]]):
    """``arviz.from_dict`` of ``groups`` (group name -> variables), ``attrs`` on every group and on the whole,
    in the call of the installed ArviZ major (ArviZ 0.x puts its global ``attrs`` on the data groups and the
    whole, and takes the others' as ``<group>_attrs``; ArviZ 1.x takes one dict of attributes per group, ``"/"``
    for the whole)."""
    az = _arviz()
    if arviz_major() >= 1:
        return az.from_dict(groups, dims=dims, attrs={"/": attrs, **{group: dict(attrs) for group in groups}})
    group_attrs = {f"{group}_attrs": dict(attrs) for group in groups if group != "observed_data"}
    return az.from_dict(**groups, dims=dims, attrs=attrs, **group_attrs)


def _predictive_generator(seed: int | None, generator: torch.Generator | None) -> torch.Generator | None:
    """The stream of the posterior predictive releases: ``generator`` (after the draws), or one of its own
    derived from ``seed`` (not the draws' stream), or torch's global one."""
    if generator is not None or seed is None:
        return generator
    state = np.random.SeedSequence([int(seed), 1]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed((int(state[0]) << 31) ^ int(state[1]))


def export_chains(num_samples: int, num_chains: int) -> int:
    """Chains of an MCMC posterior's export of ``num_samples`` draws: ``num_chains``, or fewer, at most
    ``floor(sqrt(num_samples))``, so that no chain is shorter than their count (``ceil(num_samples / C) >= C``).

    SPLE samples with many short chains (by default its 2000 draws are 4 from each of 500 chains, in 52 steps
    of cheap batched flow calls), right for its draws but not for ArviZ: both majors read chains shorter than
    their count as a mislabelled array (the warning "More chains than draws"), and R-hat, which compares each
    chain's spread with the spread between chains, read 1.12-1.18 on SPLE's chains of 4 draws for a regression
    on real data and 1.03-1.07 on ``conjugate_gaussian`` (thinned draws of one chain are still correlated at
    that length; independent draws read 1.01), 1.00-1.02 on 44 chains of 46. The export runs its own,
    fewer and longer chains (63 chains of 64 draws for 4000 draws; 44 of 46 for 2000) with the posterior's
    other MCMC settings; ``sample`` is unchanged."""
    return max(1, min(int(num_chains), math.isqrt(int(num_samples))))


def posterior_inference_data(
    posterior,
    num_samples: int | None = None,
    y: Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    predictive: bool = False,
    epsilon: float | None = None,
):
    """ArviZ's data (:func:`inference_data`) of ``posterior`` (a :class:`~dpsbi.inference.posterior.Posterior`)
    at release ``y`` (default: its default release) and ``epsilon`` (default: its default epsilon): an MCMC
    posterior's :func:`export_chains` chains, or one chain of a flow's independent draws; ``num_samples``
    draws in all (default :data:`EXPORT_DRAWS`; an MCMC export rounds up to whole chains). See
    ``Posterior.to_arviz``."""
    task = posterior.task
    num_samples = EXPORT_DRAWS if num_samples is None else int(num_samples)
    if hasattr(posterior, "sample_chains"):  # an MCMC posterior (SPLE): chains, as the sampler runs them
        count = export_chains(num_samples, posterior.mcmc.num_chains)
        chains = posterior.sample_chains(
            num_samples, y=y, generator=generator, seed=seed, epsilon=epsilon, num_chains=count
        )
        sampler = {"sampler": f"mcmc:{posterior.mcmc.method}", "num_chains": count}
    else:  # independent draws of a flow: one chain
        chains = posterior.sample((num_samples,), y=y, generator=generator, seed=seed, epsilon=epsilon)[None]
        sampler = {"sampler": "flow", "num_chains": 1}
    with warnings.catch_warnings():  # a caveat about the release was given while sampling
        warnings.simplefilter("ignore")
        y_checked = posterior._releases(y, single=True)
    settings = {"kind": posterior.kind, **posterior.options(), "flow": posterior.flow.config.to_dict()}
    used = posterior._epsilons(epsilon, 1)  # None: the posterior knows the task's epsilon only
    epsilon = float(task.epsilon) if used is None else float(used[0])
    releases = None
    if predictive:
        at = None if used is None else epsilon
        releases = simulate_releases(task, chains, _predictive_generator(seed, generator), at)
    return inference_data(
        chains.cpu(),
        parameter_names(task, chains.shape[-1]),
        attrs={
            "method": posterior.method,
            "task": task.name,
            "epsilon": epsilon,
            "release": _flat_release(y_checked),
            "settings": json.dumps(settings, default=str),
            "seed": seed,
            **sampler,
        },
        observed=y_checked,
        predictive=releases,
    )


def _scalar_settings(info: dict) -> dict:
    """The entries of a baseline's ``info`` that are settings or scalar results (numbers, strings, booleans)."""
    return {
        k: v for k, v in info.items() if isinstance(v, (int, float, str, bool)) and not isinstance(v, Tensor)
    }


def baseline_inference_data(
    result,
    task=None,
    method: str | None = None,
    y: Tensor | None = None,
    num_samples: int | None = None,
    generator: torch.Generator | None = None,
    predictive: bool = False,
):
    """ArviZ's data (:func:`inference_data`) of a :class:`~dpsbi.baselines.result.BaselineResult`; see its
    ``to_arviz``."""
    info = dict(result.info)
    chains = info.get("chains")
    attrs: dict = {"num_simulations": int(result.num_simulations)}
    if torch.is_tensor(chains) and chains.ndim == 3:  # MCMC: its chains as chains
        draws = chains
        attrs["sampler"] = "mcmc"
    elif result.weights is not None:  # importance weights: resampled to equally weighted draws
        count = result.samples.shape[0] if num_samples is None else int(num_samples)
        draws = result.resample(count, generator)[None]
        attrs.update(
            sampler="resampled importance draws", kish_ess=result.ess, weighted_draws=result.samples.shape[0]
        )
    else:  # independent (or one-chain) draws
        draws = result.samples[None] if num_samples is None else result.samples[None, :num_samples]
        attrs["sampler"] = "independent draws"
    attrs["num_chains"] = int(draws.shape[0])
    if task is not None:
        release = task.y_obs if y is None else task.check_release(y)
        attrs.update(task=task.name, epsilon=float(task.epsilon))
        if release is not None:
            attrs["release"] = _flat_release(release)
    else:
        release = y
        if y is not None:
            attrs["release"] = _flat_release(y)
    attrs["method"] = method or info.get("method") or "baseline"
    attrs["settings"] = json.dumps(_scalar_settings(info), default=str)
    releases = None
    if predictive:
        if task is None:
            raise ValueError("posterior predictive releases need the task: pass task=")
        releases = simulate_releases(task, draws, generator)
    return inference_data(
        draws.cpu(),
        parameter_names(task, draws.shape[-1]),
        attrs=attrs,
        observed=release,
        predictive=releases,
    )
