"""The inference methods an experiment can run, by name, imported lazily.

Every method is reduced to one contract: it is fitted on a task and reports rounds, each a set of posterior
draws at ``task.y_obs`` with the simulations used so far, plus the object to save (a neural posterior that
can be sampled at other releases, or a classical baseline's result).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..diagnostics import DRAWS_PER_CHAIN, summary
from ..tasks import Task

#: ``on_round(round_number, draws (n, dim_theta), num_simulations, state)``, rounds numbered from 1 (as the
#: estimators' ``on_round_end`` numbers them); ``state`` is what gets saved.
RoundCallback = Callable[[int, Tensor, int, Any], None]


@dataclass(frozen=True)
class Method:
    """A method of ``dpsbi``: ``target`` is ``"module:attribute"``; ``neural`` methods are trained
    estimators with ``.run()`` returning an amortized posterior, the others are functions returning draws.
    ``preflight(task)`` raises ``ValueError`` naming why the method cannot run on ``task``."""

    name: str
    target: str
    neural: bool = False
    preflight: Callable[[Task], None] | None = None
    seed_argument: str = "seed"  # the baseline's keyword for the seed ("generator" takes a torch.Generator)
    draws: Callable[[Any, int, torch.Generator], Tensor] | None = None  # baseline result -> draws (n, d)

    def load(self) -> Callable:
        module, attribute = self.target.split(":")
        return getattr(importlib.import_module(module), attribute)

    def check(self, task: Task) -> None:
        """Raise ``ValueError`` if the method cannot run on ``task``."""
        if self.preflight is not None:
            self.preflight(task)


def _release_shaped_like_summary(task: Task) -> None:
    """NaiveNPE's own refusal, before a run imports the method."""
    from ..inference.naive import check_release_shaped_like_summary

    check_release_shaped_like_summary(task)


def _mechanism_density(name: str) -> Callable[[Task], None]:
    """Preflight of methods that evaluate ``eta(y_obs | s)``: the release must come from the mechanism."""
    return lambda task: task.require_mechanism_release(name)


def _record_likelihood(task: Task) -> None:
    """DA-MCMC needs the record-level model (regression, naive Bayes) and a release of the mechanism."""
    from ..baselines.records import record_model

    task.require_mechanism_release("da_mcmc")
    record_model(task)


def _exponential_family(task: Task) -> None:
    """MCEM needs the task's complete-data exponential family and a release of the mechanism."""
    from ..baselines.mcem import FAMILIES

    task.require_mechanism_release("mcem")
    if task.name not in FAMILIES:
        raise ValueError(
            f"mcem needs a complete-data exponential family, registered for tasks {sorted(FAMILIES)}; got task {task.name!r}"
        )


def normal_approximation(result, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
    """Draws ``(num_samples, d)`` of ``N(estimate, observed_information^-1)``: the asymptotic distribution of
    MCEM's maximum-likelihood estimate, standing in for a posterior."""
    covariance = torch.linalg.inv(result.observed_information.double())
    covariance = (covariance + covariance.T) / 2
    noise = torch.randn(num_samples, covariance.shape[0], generator=generator, dtype=torch.float64)
    draws = result.estimate.double() + noise @ torch.linalg.cholesky(covariance).T
    return draws.to(result.estimate.dtype)


def _clt_model(task: Task) -> None:
    """MH-CLT needs a Gaussian-CLT law of the summary and a Gaussian mechanism (Alparslan-Yildirim, Sec. 3.1)."""
    from ..baselines.mcmc_clt import require_clt
    from ..tasks.latent import summary_model_of

    task.require_mechanism_release("mh_clt")
    require_clt(summary_model_of(task, None, "mh_clt"), task.mechanism)


def _latent_model(task: Task) -> None:
    """MHAAR averages over latent summaries or records: the task must carry a model of one of them."""
    from ..tasks.latent import record_model_of

    task.require_mechanism_release("mhaar")
    if getattr(task, "summary_model", None) is None:
        record_model_of(task, None, "mhaar")


def _confidential_summary(task: Task) -> None:
    """ABCDP runs on the data holder's side: it needs the task's confidential summary ``s_obs``."""
    if task.s_obs is None:
        raise ValueError(
            f"abcdp runs on the data holder's side and needs the confidential summary s_obs, which task "
            f"{task.name!r} does not hold with this release"
        )


METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        Method("sppe", "dpsbi.inference:SPPE", neural=True),
        Method(
            "sple",
            "dpsbi.inference:SPLE",
            neural=True,
            preflight=lambda task: task.mechanism.require_likelihood_flow("sple"),
        ),
        Method("naive_npe", "dpsbi.inference:NaiveNPE", neural=True, preflight=_release_shaped_like_summary),
        Method(
            "rejection_abc",
            "dpsbi.baselines.exact_abc:rejection_abc",
            preflight=_mechanism_density("rejection_abc"),
        ),
        Method("abc_is", "dpsbi.baselines.exact_abc:abc_is", preflight=_mechanism_density("abc_is")),
        Method("smc_abc", "dpsbi.baselines.smc_abc:smc_abc"),
        Method(
            "abcdp", "dpsbi.baselines.abcdp:abcdp", preflight=_confidential_summary, seed_argument="generator"
        ),
        Method("mh_clt", "dpsbi.baselines.mcmc_clt:mh_clt", preflight=_clt_model, seed_argument="generator"),
        Method(
            "pmmh",
            "dpsbi.baselines.pmmh:pmmh",
            preflight=_mechanism_density("pmmh"),
            seed_argument="generator",
        ),
        Method("mhaar", "dpsbi.baselines.mhaar:mhaar", preflight=_latent_model, seed_argument="generator"),
        Method("da_mcmc", "dpsbi.baselines.da_mcmc:da_mcmc", preflight=_record_likelihood),
        Method(
            "mcem", "dpsbi.baselines.mcem:mcem", preflight=_exponential_family, draws=normal_approximation
        ),
    ]
}


def get(name: str) -> Method:
    """The method registered as ``name``; ``ValueError`` listing the known ones otherwise."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def baseline_draws(result, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
    """Unweighted draws ``(<= num_samples, dim_theta)`` of a :class:`BaselineResult`: multinomial resampling
    of weighted draws, a random subset (all chains alike) of unweighted ones."""
    if result.weights is None and result.samples.shape[0] <= num_samples:
        return result.samples
    return result.resample(num_samples, generator)


def chain_summary(state: Any, num_samples: int, seed: int) -> dict[str, float | None]:
    """R-hat (the largest over parameters) and bulk ESS (the smallest) of the chains behind a round's draws,
    ArviZ's (:func:`dpsbi.diagnostics.summary`), for the run's rows: ``{}`` for a state without chains (a flow
    posterior's draws are independent; importance and rejection draws).

    An MCMC posterior (SPLE) is diagnosed on its chains at its default release, run under the round's ``seed``
    to ``max(num_samples, DRAWS_PER_CHAIN x num_chains)`` draws (:data:`dpsbi.diagnostics.DRAWS_PER_CHAIN`):
    the same chains as the round's ``num_samples`` draws, which are their first draws, continued so that the
    ESS can be estimated (an extra sampler run, counted with the scoring, not in the wall time). A baseline
    is diagnosed on ``info["chains"]``."""
    if hasattr(state, "sample_chains"):
        draws = max(int(num_samples), DRAWS_PER_CHAIN * int(state.mcmc.num_chains))
        return summary(state.sample_chains(draws, seed=seed))
    info = getattr(state, "info", None)
    chains = info.get("chains") if isinstance(info, dict) else None
    if torch.is_tensor(chains) and chains.ndim == 3:
        return summary(chains)
    return {}


def estimator_arguments(method: Method, settings: dict) -> dict:
    """``settings`` (a run's, every field spelled out) as a call would give them: ``training`` fields at the
    estimator's defaults left out, so that the estimator chooses them per fit as the library does (a task's
    recipes, :meth:`dpsbi.SPPE.resolve_arguments`)."""
    defaults = method.load().defaults()["training"]
    training = {
        k: v for k, v in settings.get("training", {}).items() if k not in defaults or defaults[k] != v
    }
    return {**settings, "training": training}


def _estimator(
    method: Method,
    task: Task,
    settings: dict,
    *,
    seed: int,
    checkpoint_dir: str | None,
    progress: bool,
    on_round_end=None,
):
    """The (not yet run) estimator of neural ``method`` with keyword ``settings``."""
    return method.load()(
        task,
        **estimator_arguments(method, settings),
        seed=seed,
        checkpoint_dir=checkpoint_dir,
        progress=progress,
        on_round_end=on_round_end,
    )


def budget_settings(method: Method, budget: dict) -> dict:
    """The settings that the neural ``budget`` (``{key: value}``) gives ``method``: a key the estimator takes
    as an argument (``rounds``, ``sims_per_round``, ``inner_samples``) as it is, a key of
    :class:`~dpsbi.inference.training.TrainingSettings` (``max_epochs``, ``max_steps``) in ``training``. An
    estimator that takes ``num_simulations`` in one round (NaiveNPE) gets ``rounds x sims_per_round`` of them,
    the one of the two the budget leaves unset at SPPE's default (:data:`~dpsbi.inference.sppe.ROUNDS`,
    :meth:`dpsbi.SPPE.default_sims_per_round`), so that one budget gives every neural method the same number of
    simulations. Other keys (NaiveNPE's ``inner_samples``, fixed at 1)
    are left out, and a classical baseline gets nothing."""
    if not method.neural:
        return {}
    from ..inference import SPPE
    from ..inference.sppe import ROUNDS
    from ..inference.training import TrainingSettings

    arguments = inspect.signature(method.load()).parameters
    settings = {k: v for k, v in budget.items() if k in arguments}
    sequential = {k: budget[k] for k in ("rounds", "sims_per_round") if k in budget}
    if "num_simulations" in arguments and sequential:
        defaults = {"rounds": ROUNDS, "sims_per_round": SPPE.default_sims_per_round(False)}
        per_round = {**defaults, **sequential}
        settings["num_simulations"] = per_round["rounds"] * per_round["sims_per_round"]
    training = {k: v for k, v in budget.items() if k in TrainingSettings.field_names()}
    return {**settings, "training": training} if training else settings


def _baseline_arguments(method: Method, settings: dict, seed: int, progress: bool) -> dict:
    """Keywords of a baseline's call: its ``settings``, its seed (an int or a seeded ``torch.Generator``) and ``progress``."""
    seed_value = torch.Generator().manual_seed(seed) if method.seed_argument == "generator" else seed
    return {**settings, method.seed_argument: seed_value, "progress": progress}


def check_settings(method: Method, task: Task, settings: dict, seed: int) -> None:
    """Raise ``ValueError`` or ``TypeError`` naming the problem when ``method`` cannot take ``settings``,
    without fitting anything: a neural estimator is constructed (it validates every setting; a widened SPLE,
    naive Bayes' amortized default, simulates its 1000-table probe of the statistic's constraints), a baseline's
    keywords are bound to its signature (unknown or missing keywords)."""
    if method.neural:
        estimator = _estimator(method, task, settings, seed=seed, checkpoint_dir=None, progress=False)
        _check_epsilon_range(estimator, task)
        return
    signature = inspect.signature(method.load())
    try:
        signature.bind(task, **_baseline_arguments(method, settings, seed, False))
    except TypeError as error:
        taken = [
            name for name in list(signature.parameters)[1:] if name not in (method.seed_argument, "progress")
        ]
        raise TypeError(f"{error}; it takes {', '.join(taken)}") from None


def _check_epsilon_range(estimator, task: Task) -> None:
    """A run scores the posterior at ``task.y_obs`` and the task's epsilon: an ``epsilon_range`` must hold it."""
    from ..mechanisms.epsilon import nominal_epsilon

    bounds = getattr(estimator, "epsilon_range", None)
    if bounds is not None and not bounds[0] <= nominal_epsilon(task.mechanism) <= bounds[1]:
        raise ValueError(
            f"epsilon_range [{bounds[0]:g}, {bounds[1]:g}] does not hold the task's epsilon = "
            f"{nominal_epsilon(task.mechanism):g}, at which the run evaluates the posterior"
        )


def fit(
    method: Method,
    task: Task,
    settings: dict,
    *,
    seed: int,
    num_samples: int,
    checkpoint_dir: str,
    progress: bool,
    on_round: RoundCallback,
) -> Any:
    """Fit ``method`` on ``task`` with keyword ``settings`` (its config); ``on_round`` receives every round's
    ``num_samples`` draws at ``task.y_obs``, rounds numbered from 1 (a neural estimator resumed from
    ``checkpoint_dir`` reports only the rounds it trains). Returns the final state (posterior or baseline result)."""
    if method.neural:

        def round_end(round_number: int, posterior, num_simulations: int) -> None:
            on_round(round_number, posterior.sample((num_samples,), seed=seed), num_simulations, posterior)

        return _estimator(
            method,
            task,
            settings,
            seed=seed,
            checkpoint_dir=checkpoint_dir,
            progress=progress,
            on_round_end=round_end,
        ).run()
    result = method.load()(task, **_baseline_arguments(method, settings, seed, progress))
    draws = (method.draws or baseline_draws)(result, num_samples, torch.Generator().manual_seed(seed))
    on_round(1, draws, result.num_simulations, result)
    return result
