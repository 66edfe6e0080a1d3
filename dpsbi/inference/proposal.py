"""A trained posterior flow at one release as an importance-sampling proposal.

A flow is fast but approximate: an amortized fit can sit a fraction of an sd off at a release in the prior's
tails (docs/RESULTS.md, "Epsilon 10's errors are in the posterior's place"). Weighting its draws by the exact
private posterior over the proposal corrects that: with the mechanism as kernel, ``prior(theta) eta(y | s) /
proposal(theta)`` for one simulation ``s`` of ``theta`` is an unbiased estimate of the posterior over the
proposal up to a constant, so the self-normalized weighted draws are consistent whatever the flow's error
(``dpsbi.baselines.corrected(posterior, n, y=y)``, which samples from it in its first stage; Gong 2022, Sec. 3; the same correction as
DINGO-IS, Dax et al. 2023). The flow is mixed with the prior (a defensive mixture, Hesterberg 1995), so that no
weight exceeds ``1 / defensive`` times its likelihood, however thin the flow's tails; the weights' effective sample
size then says how far the flow was from the posterior.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import torch
from torch import Tensor
from torch.distributions import Distribution

from ..tasks.base import prior_device
from .release_check import ReleaseOutsideTraining


class DefensiveProposal(Distribution):
    """``(1 - defensive) q(theta | y, epsilon) + defensive prior(theta)`` over ``(dim_theta,)``: ``posterior``'s
    flow at one release ``y`` (and ``epsilon``, for a posterior trained over a range) mixed with its task's prior.
    Draws come from the global torch generator (``corrected`` seeds it); ``log_prob`` takes ``(n, dim_theta)`` and
    returns ``(n,)``, the prior's part ``-inf`` outside its support."""

    arg_constraints: dict = {}
    has_rsample = False

    def __init__(self, posterior, y: Tensor | None, epsilon: float | None, defensive: float) -> None:
        if not 0 < defensive < 1:
            raise ValueError(
                f"defensive must be in (0, 1): the prior's share of the proposal, got {defensive}"
            )
        self.posterior, self.defensive = posterior, float(defensive)
        self.y = posterior.default_x if y is None else y
        self.epsilon = epsilon
        super().__init__(event_shape=torch.Size([posterior.task.dim_theta]), validate_args=False)

    @property
    def support(self):
        return self.posterior.task.prior.support

    def sample(self, sample_shape=torch.Size()) -> Tensor:
        return self._draws(torch.Size(sample_shape))[0]

    def sample_and_log_prob(self, sample_shape=torch.Size()) -> tuple[Tensor, Tensor]:
        """:meth:`sample`'s draws ``sample_shape + (dim_theta,)`` (the same ones from the same global stream) and
        their :meth:`log_prob` ``sample_shape``: the flow's density of its own draws comes from the pass that drew
        them (:meth:`FlowPosterior.sample_and_log_prob`), so the flow is evaluated again only at the prior's."""
        theta, pick, log_q = self._draws(torch.Size(sample_shape))
        if pick.any():
            with _warned_once():
                log_q[pick] = self.posterior.log_prob(theta[pick], y=self.y, epsilon=self.epsilon)
        return theta, self._mixed(theta, log_q)

    def log_prob(self, value: Tensor) -> Tensor:
        with _warned_once():
            log_q = self.posterior.log_prob(value, y=self.y, epsilon=self.epsilon)
        return self._mixed(value, log_q)

    def _draws(self, shape: torch.Size) -> tuple[Tensor, Tensor, Tensor]:
        """Draws ``shape + (dim_theta,)``, whether each came from the prior ``shape``, and the flow's log density
        ``shape`` of its own draws (to be replaced at the prior's)."""
        with _warned_once():
            flow, log_q = self.posterior.sample_and_log_prob(shape, y=self.y, epsilon=self.epsilon)
        prior = self.posterior.task.prior.sample(shape).to(flow)
        pick = torch.rand(shape, device=flow.device) < self.defensive
        return torch.where(pick[..., None], prior, flow), pick, log_q

    def _mixed(self, value: Tensor, log_q: Tensor) -> Tensor:
        """The mixture's log density ``value.shape[:-1]`` from the flow's, ``log_q``, at ``value``."""
        task = self.posterior.task
        log_prior = task.log_prior(value.to(prior_device(task.prior)))
        return torch.logaddexp(
            math.log1p(-self.defensive) + log_q, math.log(self.defensive) + log_prior.to(log_q)
        )


@contextlib.contextmanager
def _warned_once():
    """What the posterior says of the release (outside its training releases, or not the one a sequential fit
    was trained for) was said once, when the proposal was built: not again at every batch of draws."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReleaseOutsideTraining)
        warnings.filterwarnings("ignore", message=r"this \S+ posterior was trained sequentially")
        yield
