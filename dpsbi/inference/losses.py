"""The SPPE and SPLE losses: averages over ``M`` inner releases ``y_ij = G(s_i, u_ij)`` per training pair.

The uniforms ``u_ij`` are scrambled Sobol points, independently randomized per pair (RQMC, ``qmc=True``),
or plain uniforms (MC, ``qmc=False``); ``M = 1`` with MC is the naive single-release estimator. All ``N x M``
(x atoms) flow evaluations of a batch run as one vectorized call.

``flow`` is any conditional density with ``log_prob(x, context)`` broadcasting over batch shapes, e.g.
:class:`~dpsbi.inference.flows.ConditionalFlow`. Parameters are in the flow's space (the task's
unconstrained space, ``z = task.transform.inv(theta)``; the identity for most tasks).

Epsilon-conditioned training (``epsilon (N,)``, one privacy level per pair): pair ``i``'s releases are drawn
by the mechanism re-calibrated at ``epsilon_i`` (one vectorized call,
:func:`~dpsbi.mechanisms.epsilon.at_epsilons`) and ``log epsilon_i`` joins the flow's context: the posterior
flow's after the release, ``q(theta | y, log epsilon)``, the likelihood flow's after the parameters,
``q(y | theta, log epsilon)``. In the atomic loss each pair's contrasting atoms are scored at that pair's
release and epsilon (the context is the pair's), so the contrastive set shares the row's epsilon.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..mechanisms import Mechanism
from ..mechanisms.base import coordinate_tensor, lattice_cells
from ..mechanisms.epsilon import at_epsilons
from ..qmc import uniforms


def with_log_epsilon(x: Tensor, epsilon: Tensor | None) -> Tensor:
    """``x (N, ..., k)`` with ``log epsilon_i`` appended as a last coordinate of every entry of row ``i``, for
    ``epsilon (N,)``: ``(N, ..., k + 1)``; ``x`` itself when ``epsilon`` is ``None``."""
    if epsilon is None:
        return x
    log_eps = torch.log(epsilon).to(x).reshape((-1,) + (1,) * (x.ndim - 1))
    return torch.cat([x, log_eps.expand(x.shape[:-1] + (1,))], -1)


def posterior_log_prob(flow, theta: Tensor, y: Tensor, epsilon: Tensor | None = None) -> Tensor:
    """``log q(theta_i | y_ij)`` ``(N, M)`` of parameters ``theta (N, d)`` at releases ``y (N, M, dim_y)``, each
    row's ``log epsilon`` appended to its releases where ``epsilon (N,)`` is given."""
    return flow.log_prob(theta.unsqueeze(-2), with_log_epsilon(y, epsilon))


def likelihood_log_prob(flow, theta: Tensor, y: Tensor, epsilon: Tensor | None = None) -> Tensor:
    """``log q(y_ij | theta_i)`` ``(N, M)`` of releases ``y (N, M, dim_y)`` given parameters ``theta (N, d)``, each
    row's ``log epsilon`` appended to its parameters where ``epsilon (N,)`` is given."""
    return flow.log_prob(y, with_log_epsilon(theta, epsilon).unsqueeze(-2))


def dequantized(y: Tensor, mechanism: Mechanism, v: Tensor) -> Tensor:
    """Lattice releases ``y (..., dim)`` spread over their cells: ``y + h v`` for ``v`` in ``[0, 1)^k``, ``h`` the
    mechanism's :attr:`~dpsbi.mechanisms.Mechanism.lattice` spacing (``k = dim``). A density of ``y + h v`` with
    ``v`` uniform integrates over a cell to the probability of its lattice point (uniform dequantization). Where
    only some coordinates lie on a lattice (a :class:`~dpsbi.mechanisms.Composition` of continuous and integer
    blocks), ``v`` has one column per lattice coordinate (``k`` of them, :func:`~dpsbi.mechanisms.base.lattice_cells`)
    and only those move, each by its own spacing."""
    index, spacing = lattice_cells(mechanism)
    if not index:
        raise ValueError(f"{mechanism!r} releases values with a density: there is nothing to dequantize")
    if mechanism.lattice is not None:
        return y + mechanism.lattice * v.to(y)
    spread = tuple(tuple(h if j == i else 0.0 for j in range(mechanism.dim)) for i, h in zip(index, spacing))
    return y + v.to(y) @ coordinate_tensor(mechanism, spread, y)  # (k, dim): one nonzero per lattice column


def inner_releases(
    s: Tensor,
    mechanism: Mechanism,
    inner_samples: int,
    qmc: bool = True,
    generator: torch.Generator | None = None,
    dequantize: bool = False,
    epsilon: Tensor | None = None,
    u: Tensor | None = None,
) -> Tensor:
    """Releases ``y_ij = G(s_i, u_ij)`` of shape ``(N, M, dim_s)`` for confidential summaries ``s (N,
    input_dim)`` (the mechanism's; ``dim_s`` unless it composes or post-processes).

    ``u (N, M, k)``: the uniforms (:func:`noise_uniforms`), drawn here from ``generator`` when not given.
    ``dequantize``: lattice releases spread over their cells (:func:`dequantized`), the cell offset taken from
    extra coordinates of the same RQMC point as the mechanism noise, so that one point set integrates both.
    ``epsilon (N,)``: row ``i``'s releases by the mechanism re-calibrated at ``epsilon_i``."""
    if u is None:
        u = noise_uniforms(
            s.shape[0], mechanism, inner_samples, qmc, generator, dequantize, s.device, s.dtype
        )
    if epsilon is not None:
        mechanism = at_epsilons(mechanism, epsilon.reshape(-1, 1, 1))
    y = mechanism.sample(s.unsqueeze(-2), u[..., : mechanism.noise_dim])
    return dequantized(y, mechanism, u[..., mechanism.noise_dim :]) if dequantize else y


def noise_uniforms(
    rows: int,
    mechanism: Mechanism,
    inner_samples: int,
    qmc: bool = True,
    generator: torch.Generator | None = None,
    dequantize: bool = False,
    device=None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """The uniforms ``(rows, M, noise_dim [+ dim])`` of :func:`inner_releases`: RQMC (each row its own scrambled
    Sobol points) or plain MC, with one more coordinate per lattice coordinate of the release (``dim`` for a
    lattice mechanism) for the cell offsets when ``dequantize``; on ``device`` (default: the generator's, as
    :func:`~dpsbi.qmc.uniforms` chooses)."""
    extra = len(lattice_cells(mechanism)[0]) if dequantize else 0
    return uniforms(rows, inner_samples, mechanism.noise_dim + extra, qmc, generator, device, dtype)


def atom_indices(batch: int, atoms: int, generator: torch.Generator | None = None, device=None) -> Tensor:
    """``(batch, atoms)`` row indices: row ``i`` itself, then ``atoms - 1`` distinct other rows drawn uniformly
    (the batch is a uniform draw from all simulations so far, so the atoms are too). Robert Floyd's algorithm,
    vectorized over rows: ``O(batch x atoms^2)`` work and memory, and no host synchronization
    (``torch.multinomial`` without replacement reads its input on the host)."""
    if not 1 <= atoms <= batch:
        raise ValueError(f"atoms must lie in [1, batch size = {batch}], got {atoms}")
    own = torch.arange(batch, device=device).unsqueeze(-1)
    others = torch.empty(batch, 0, dtype=torch.long, device=device)  # offsets in [0, batch - 2], distinct
    for j in range(batch - atoms, batch - 1):  # Floyd: a uniform (atoms - 1)-subset of range(batch - 1)
        pick = (
            torch.rand(batch, 1, generator=generator, device=device, dtype=torch.float64) * (j + 1)
        ).long()
        taken = (others == pick).any(-1, keepdim=True)
        others = torch.cat([others, torch.where(taken, j, pick)], -1)
    return torch.cat([own, (own + 1 + others) % batch], dim=-1)


def posterior_loss(
    flow,
    theta: Tensor,
    y: Tensor,
    atoms: int = 1,
    log_prior: Tensor | None = None,
    generator: torch.Generator | None = None,
    reduction: str = "mean",
    index: Tensor | None = None,
    prior_rows: Tensor | None = None,
) -> Tensor:
    """Posterior-estimation loss for parameters ``theta (N, d)`` and releases ``y (N, M, dim_y)``.

    ``atoms = 1``: ``-mean_ij log q(theta_i | y_ij)`` (proposal = prior). ``atoms = A > 1``: atomic APT,
    ``-mean_ij log softmax_a [log q(theta_a | y_ij) - log p(theta_a)]`` at the true ``theta_i``, with the
    atoms of row ``i`` (itself and ``A - 1`` other rows, shared by its ``M`` releases) and ``log_prior (N,)``
    the prior log densities of the rows in the flow's space. ``A`` is capped at the batch size.
    ``reduction="none"`` returns the ``(N,)`` inner averages instead of their mean. ``index (N, A)``: the atoms
    (:func:`atom_indices`), drawn here from ``generator`` when not given. ``prior_rows (N,)``: 1 for the rows
    drawn from the prior, 0 elsewhere; with atoms, those rows also add the plain term ``-log q(theta_i | y_ij)``
    (sbi's combined loss; the flow evaluations are the atomic term's own), which ties ``q``'s mass away from
    the atoms to the posterior: the atomic term alone leaves it free (leakage).
    """
    if atoms == 1:
        return _reduce(-posterior_log_prob(flow, theta, y), reduction)
    if log_prior is None:
        raise ValueError("the atomic loss (atoms > 1) needs log_prior, the prior log density of every row")
    if index is None:
        index = atom_indices(theta.shape[0], min(atoms, theta.shape[0]), generator, theta.device)  # (N, A)
    logits = flow.log_prob(theta[index].unsqueeze(1), y.unsqueeze(2)) - log_prior[index].unsqueeze(
        1
    )  # (N, M, A)
    terms = -torch.log_softmax(logits, dim=-1)[..., 0]
    if prior_rows is not None:  # log q(theta_i | y_ij) = logits[..., 0] + log p(theta_i)
        terms = terms - prior_rows.unsqueeze(-1) * (logits[..., 0] + log_prior.unsqueeze(-1))
    return _reduce(terms, reduction)


def sppe_loss(
    flow,
    theta: Tensor,
    s: Tensor,
    mechanism: Mechanism,
    inner_samples: int = 32,
    qmc: bool = True,
    generator: torch.Generator | None = None,
    atoms: int = 1,
    log_prior: Tensor | None = None,
    reduction: str = "mean",
    epsilon: Tensor | None = None,
    u: Tensor | None = None,
    index: Tensor | None = None,
    prior_rows: Tensor | None = None,
) -> Tensor:
    """SPPE loss of a posterior flow ``q(theta | y)`` on pairs ``theta (N, d)``, ``s (N, input_dim)``:
    :func:`posterior_loss` on ``M = inner_samples`` fresh releases of each ``s_i``. ``epsilon (N,)``: each
    pair's privacy level, for a flow ``q(theta | y, log epsilon)`` (module docstring). ``u`` and ``index``:
    the step's uniforms and atoms drawn beforehand (else from ``generator``); ``prior_rows``: the combined
    loss (:func:`posterior_loss`)."""
    y = inner_releases(s, mechanism, inner_samples, qmc, generator, epsilon=epsilon, u=u)
    return posterior_loss(
        flow, theta, with_log_epsilon(y, epsilon), atoms, log_prior, generator, reduction, index, prior_rows
    )


def sple_loss(
    flow,
    theta: Tensor,
    s: Tensor,
    mechanism: Mechanism,
    inner_samples: int = 32,
    qmc: bool = True,
    generator: torch.Generator | None = None,
    reduction: str = "mean",
    dequantize: bool = False,
    epsilon: Tensor | None = None,
    u: Tensor | None = None,
) -> Tensor:
    """SPLE loss of a likelihood flow ``q(y | theta)``: ``-mean_ij log q(y_ij | theta_i)`` over
    ``M = inner_samples`` fresh releases ``y_ij`` of each ``s_i``; ``theta (N, d)``, ``s (N, input_dim)``.
    ``reduction="none"`` returns the ``(N,)`` inner averages instead of their mean. ``dequantize`` (lattice
    mechanisms): ``q`` models ``y + h v`` instead (:func:`inner_releases`), a proper density whose mass on a
    release's cell estimates the release's probability; without it, maximum likelihood can pile density on
    the lattice points without bound. ``epsilon (N,)``: each pair's privacy level, for a flow
    ``q(y | theta, log epsilon)`` (module docstring). ``u``: the step's uniforms drawn beforehand (else from
    ``generator``)."""
    y = inner_releases(s, mechanism, inner_samples, qmc, generator, dequantize, epsilon, u)
    return _reduce(-likelihood_log_prob(flow, theta, y, epsilon), reduction)


def _reduce(terms: Tensor, reduction: str) -> Tensor:
    """Loss terms ``(N, M)`` averaged over the inner draws (``"none"``: shape ``(N,)``) or over all (``"mean"``)."""
    if reduction == "mean":
        return terms.mean()
    if reduction == "none":
        return terms.mean(-1)
    raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")


def loss_estimates(
    loss,
    flow,
    theta: Tensor,
    s: Tensor,
    mechanism: Mechanism,
    inner_samples: int,
    qmc: bool,
    repeats: int,
    generator: torch.Generator | None = None,
) -> Tensor:
    """``repeats`` independent estimates of ``loss`` (:func:`sppe_loss` or :func:`sple_loss`, one-round
    form) for the fixed pairs ``theta (N, d)``, ``s (N, input_dim)``, differing only in the mechanism noise.
    One batched call: the pairs are replicated ``repeats`` times, each copy with its own randomization."""
    with torch.no_grad():
        rows = loss(
            flow,
            theta.repeat(repeats, 1),
            s.repeat(repeats, 1),
            mechanism,
            inner_samples,
            qmc,
            generator,
            reduction="none",
        )
    return rows.reshape(repeats, theta.shape[0]).mean(-1)
