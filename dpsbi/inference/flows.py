"""Conditional neural spline flows (sbi's NSF builder on nflows) with z-scoring of inputs and context, and an
optional embedding network for the context (:class:`FlowSettings` ``embedding``)."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

import torch
from nflows.transforms import PointwiseAffineTransform
from sbi.utils.sbiutils import Standardize, standardizing_net, z_standardization
from torch import Tensor, nn

from ..mechanisms.stabilizing import Stabilizer
from .epsilon_scaling import EpsilonStandardize
from .settings import Settings
from .spline_flow import SplineFlow

#: The flows' implementations: ours without host synchronization (the default), and sbi's on nflows.
BACKENDS = ("dpsbi", "nflows")
#: How a release in the context of a flow conditioned on ``log epsilon`` is z-scored (FlowSettings ``release_scaling``).
RELEASE_SCALINGS = ("per_epsilon", "both", "global")


def _mlp(context_dim: int) -> nn.Module:
    """``"mlp"``: sbi's ``FCEmbedding``, the z-scored context through two hidden layers of 100 ReLU units to 20
    features (ReLU)."""
    from sbi.neural_nets.embedding_nets import FCEmbedding

    return FCEmbedding(context_dim, output_dim=20, num_layers=3, num_hiddens=100)


#: The named embeddings: ``name -> build(context_dim)``; a name is what posterior files and checkpoints record.
EMBEDDINGS = {"mlp": _mlp}


def describe_embedding(embedding: str | nn.Module | None) -> str | dict | None:
    """An embedding as JSON: ``None``, its name, or for a module ``{"module": class path, "architecture": repr}``
    (a description only: a module's constructor arguments are not known, so it cannot be rebuilt from it)."""
    if embedding is None or isinstance(embedding, str):
        return embedding
    kind = type(embedding)
    return {"module": f"{kind.__module__}.{kind.__qualname__}", "architecture": repr(embedding)}


@dataclass(frozen=True)
class FlowSettings(Settings):
    """Architecture of a conditional neural spline flow; the defaults are the paper's: 8 coupling
    transforms, each conditioned by a residual net of 2 blocks of 50 ReLU units, 10 bins, tail bound 5.

    ``embedding`` maps the flow's z-scored context to the features every coupling transform is conditioned on:
    ``None`` (the z-scored context itself, as before), a name in :data:`EMBEDDINGS` (``"mlp"``: two hidden
    layers of 100 ReLU units to 20 features, sbi's ``FCEmbedding``), or any ``nn.Module`` taking
    ``(n, context_dim)`` to ``(n, features)``, e.g. one of sbi's embedding nets (each flow built from the config
    gets its own deep copy, trained with the flow). The context is the release for SPPE and NaiveNPE, where
    a many-cell release is what the embedding compresses; for SPLE it is the parameter (the release is the
    flow's input), so an embedding there only reshapes theta and does not address a high-dimensional release.
    The embedding is computed once per distinct context, before the broadcasting that pairs it with atoms.

    Saving: a name is recorded in posterior files and checkpoint fingerprints and rebuilds the same network
    (weights from the file). A module is recorded by class path and architecture only (:func:`describe_embedding`):
    a checkpoint resumes when the same module is passed again, but a saved posterior file cannot be loaded
    without it, and ``load_posterior`` refuses such a file in one line naming the class; save a flow with a
    named embedding to reload it from the file alone.

    ``backend``: ``"dpsbi"`` (the default; :mod:`dpsbi.inference.spline_flow`, the same architecture with zuko's
    spline and no host synchronization, so that a GPU step never waits) or ``"nflows"`` (sbi's ``build_nsf``,
    which waits for the device at every spline layer; what files and checkpoints written before ``backend``
    existed hold, and :meth:`recorded` reads them so).

    ``release_scaling``, for a posterior flow conditioned on ``log epsilon`` (``epsilon_range``): ``"per_epsilon"``
    (the default) z-scores each release by the training releases drawn at its own epsilon
    (:class:`~dpsbi.inference.epsilon_scaling.EpsilonStandardize`), ``"global"`` by all of them at once (what files
    written before it existed hold), ``"both"`` gives the flow the two side by side. Measured in docs/RESULTS.md
    ("Why the narrow end fell short"). Other flows z-score their context globally whatever it says.

    ``clamp_release``: a posterior flow clamps each release coordinate to the task's
    :meth:`~dpsbi.tasks.Task.release_bounds` before anything else (where the mechanism's noise makes that lossless:
    the exact posterior is the same), in training and in inference; files written before it existed did not.

    ``stabilize_release``, for a posterior flow conditioned on ``log epsilon``: each release coordinate whose
    mechanism names a variance-stabilizing map (:attr:`~dpsbi.mechanisms.Mechanism.stabilizing_map`: the binomial
    curve's arcsine) goes through it after clamping, before z-scoring; one-to-one, so the exact posterior is the
    same. Measured in docs/RESULTS.md ("SIR's flow on the arcsine of its release"); files written before it
    existed did not. Other flows, and mechanisms that name no map, are unchanged whatever it says."""

    label: ClassVar[str] = "flow"
    #: What files and checkpoints written before a setting existed did: :meth:`recorded` fills it in.
    before: ClassVar[dict] = {
        "backend": "nflows",
        "release_scaling": "global",
        "clamp_release": False,
        "stabilize_release": False,
    }
    transforms: int = 8
    hidden: int = 50
    blocks: int = 2
    bins: int = 10
    tail_bound: float = 5.0
    embedding: str | nn.Module | None = None
    backend: str = "dpsbi"
    release_scaling: str = "per_epsilon"
    clamp_release: bool = True
    stabilize_release: bool = True

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown flow backend {self.backend!r}; one of {BACKENDS}")
        if self.release_scaling not in RELEASE_SCALINGS:
            raise ValueError(
                f"unknown flow release_scaling {self.release_scaling!r}; one of {RELEASE_SCALINGS}"
            )
        for name in ("transforms", "hidden", "blocks", "bins"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"flow {name} must be a positive integer, got {getattr(self, name)}")
        if not self.tail_bound > 0:
            raise ValueError(f"flow tail_bound must be > 0, got {self.tail_bound}")
        embedding = self.embedding
        if isinstance(embedding, dict) and "module" in embedding:
            raise ValueError(
                f"this flow's embedding was a user module ({embedding['module']}), recorded by class and architecture "
                "only: a file cannot rebuild it; rebuild the estimator with the module, or train with a named embedding "
                f"({', '.join(EMBEDDINGS)}) to save and load"
            )
        if isinstance(embedding, str) and embedding not in EMBEDDINGS:
            raise ValueError(f"unknown flow embedding {embedding!r}; named embeddings: {sorted(EMBEDDINGS)}")
        if not (embedding is None or isinstance(embedding, (str, nn.Module))):
            raise TypeError(
                f"flow embedding must be None, a name in {sorted(EMBEDDINGS)} or an nn.Module, got {type(embedding).__name__}"
            )

    @classmethod
    def recorded(cls, record: dict) -> FlowSettings:
        """The settings a file or checkpoint recorded; those written before ``backend`` existed used nflows,
        before ``release_scaling`` existed global z-scoring, before ``clamp_release`` no clamping, before
        ``stabilize_release`` no stabilizing map."""
        return cls.coerce({**cls.before, **record})

    def to_dict(self) -> dict:
        """The settings as JSON values (an embedding module as its description, :func:`describe_embedding`)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["embedding"] = describe_embedding(self.embedding)
        return out

    def embedding_net(self, context_dim: int) -> nn.Module:
        """A fresh embedding network for a context of ``context_dim`` (``nn.Identity`` without one)."""
        if self.embedding is None:
            return nn.Identity()
        if isinstance(self.embedding, str):
            return EMBEDDINGS[self.embedding](context_dim)
        return copy.deepcopy(self.embedding)


class ConditionalFlow(nn.Module):
    """A density ``q(x | c)`` over ``x`` of shape ``(dim,)`` given a context ``c`` of shape ``(context_dim,)``.

    Built from example batches ``inputs (n, dim)`` and ``context (n, context_dim)``, whose per-dimension means
    and standard deviations z-score ``x`` (a first affine layer, so densities stay those of ``x``) and ``c``
    (before the embedding). ``epsilon_context``: the context is a release with ``log epsilon`` as its last
    column, z-scored as ``config.release_scaling`` says. ``release_bounds (2, k)``: with ``config.clamp_release``,
    the first ``k`` columns of the context (the release) are clamped to them first (buffers ``clamp_low``,
    ``clamp_high`` of ``context_dim``, unbounded where nothing is clamped; present whenever ``clamp_release`` is). The statistics are buffers: they are part of the
    ``state_dict`` and come back with it. ``stabilizing_maps``: the first ``len`` columns of the context go through
    these maps of :data:`~dpsbi.mechanisms.stabilizing.STABILIZING_MAPS` (``None``: unchanged) after clamping and
    before z-scoring (:class:`~dpsbi.mechanisms.stabilizing.Stabilizer`; names, not weights: files record them
    beside the shape). ``config.backend`` picks the layers: ``"dpsbi"`` (:class:`~dpsbi.inference.spline_flow.SplineFlow`,
    no host synchronization) or ``"nflows"`` (sbi's ``build_nsf``, the flows of files written before).
    """

    def __init__(
        self,
        config: FlowSettings,
        inputs: Tensor,
        context: Tensor,
        epsilon_context: bool = False,
        release_bounds: Tensor | None = None,
        stabilizing_maps: Sequence[str | None] = (),
    ) -> None:
        super().__init__()
        if inputs.ndim != 2 or context.ndim != 2 or len(inputs) != len(context) or len(inputs) < 2:
            raise ValueError(
                f"flow needs example batches (n, dim) and (n, context_dim) with n >= 2, "
                f"got {tuple(inputs.shape)} and {tuple(context.shape)}"
            )
        self.config, self.epsilon_context = config, bool(epsilon_context)
        self.dim, self.context_dim = int(inputs.shape[1]), int(context.shape[1])
        if config.clamp_release:
            self._register_clamp(release_bounds)
        self.stabilizer = Stabilizer(stabilizing_maps, self.context_dim)
        context = self._prepared(context)
        # built in torch's default dtype: wider examples (float64 counts) only set the z-scoring constants
        inputs, context = inputs.to(torch.get_default_dtype()), context.to(torch.get_default_dtype())
        try:
            scaling = (
                EpsilonStandardize(context, both=config.release_scaling == "both")
                if self.epsilon_context and config.release_scaling != "global"
                else standardizing_net(context, structured_dims=False)
            )
            scaled = scaling(
                context
            )  # what the couplings or the embedding see: k + 1 columns, 2k + 1 for "both"
            if (
                config.backend == "nflows"
            ):  # built for the scaled context, then fed the raw one through `scaling`
                self.net = _nflows(config, inputs, scaled)
                self.net._embedding_net[0] = scaling
            else:
                embedding = nn.Sequential(scaling, config.embedding_net(scaled.shape[-1]))
                self.embedding = embedding
                features = embedding(context[:2]).shape[-1]
                mean, std = z_standardization(inputs, False)
                self.spline = SplineFlow(self.dim, features, config, mean, std)
        except (RuntimeError, ValueError, TypeError) as error:
            if config.embedding is None:
                raise
            name = config.embedding if isinstance(config.embedding, str) else type(config.embedding).__name__
            raise ValueError(
                f"flow embedding {name} does not map the flow's context "
                f"(n, {self.context_dim}) to (n, features): {error}"
            ) from None

    def _register_clamp(self, release_bounds: Tensor | None) -> None:
        """The buffers ``clamp_low``, ``clamp_high`` ``(context_dim,)`` in torch's default dtype (as the flow's
        weights, so that they move to any device): ``release_bounds (2, k)`` over the first ``k`` columns, the
        dtype's largest magnitude elsewhere and for infinite bounds (files hold finite numbers only)."""
        dtype = torch.get_default_dtype()
        huge = torch.finfo(dtype).max
        bounds = torch.tensor([[-huge], [huge]], dtype=dtype).repeat(1, self.context_dim)
        if release_bounds is not None:
            bounds[:, : release_bounds.shape[-1]] = release_bounds.clamp(-huge, huge).to(dtype)
        self.register_buffer("clamp_low", bounds[0].clone())
        self.register_buffer("clamp_high", bounds[1].clone())

    def _prepared(self, context: Tensor) -> Tensor:
        """``context (..., context_dim)`` clamped to the buffers (in its own dtype) where ``clamp_release``, then
        through its :attr:`stabilizing_maps`."""
        if self.config.clamp_release:
            context = torch.clamp(
                context, self.clamp_low.to(context.dtype), self.clamp_high.to(context.dtype)
            )
        return self.stabilizer(context)

    @classmethod
    def blank(
        cls,
        config: FlowSettings,
        dim: int,
        context_dim: int,
        epsilon_context: bool = False,
        stabilizing_maps: Sequence[str | None] = (),
    ) -> ConditionalFlow:
        """A flow of the right shape whose weights and z-scoring are to come from ``load_state_dict``."""
        inputs, context = torch.eye(2, dim), torch.eye(2, context_dim)
        return cls(config, inputs, context, epsilon_context, stabilizing_maps=stabilizing_maps)

    @property
    def context_net(self) -> nn.Module:
        """The context's z-scoring followed by the embedding (``nn.Sequential``), as the couplings see it."""
        return self.net._embedding_net if self.config.backend == "nflows" else self.embedding

    @property
    def stabilizing_maps(self) -> tuple[str | None, ...]:
        """The maps the first columns of the context go through (:class:`~dpsbi.mechanisms.stabilizing.Stabilizer`)."""
        return self.stabilizer.names

    @property
    def synchronizes(self) -> bool:
        """Whether its layers wait for the device (nflows' spline checks its inputs on the host): such a flow's
        training step cannot be captured as a CUDA graph."""
        return self.config.backend == "nflows"

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of its weights (torch's default when it was built)."""
        return next(self.parameters()).dtype

    def log_prob(self, x: Tensor, context: Tensor) -> Tensor:
        """``log q(x | c)`` for ``x (..., dim)`` and ``context (..., context_dim)`` whose batch shapes
        broadcast; returns the broadcast batch shape. Inputs wider than the flow's :attr:`dtype` (float64 counts
        beyond 2^24) are z-scored in their own precision, then converted (:func:`_z_scored`)."""
        x, embedded, batch = self._broadcast(x, context)
        if self.config.backend == "dpsbi":
            return self.spline.log_prob(x, embedded).reshape(batch)
        transforms = self.net._transform._transforms
        with _nflows_quiet():
            z, first_log_det = _z_scored(transforms[0], x, self.dtype, embedded)
            noise, log_det = self.net._transform._cascade(z.to(self.dtype), transforms[1:], embedded)
        log_q = self.net._distribution.log_prob(noise, context=embedded) + first_log_det + log_det
        return log_q.reshape(batch)

    def sample(self, noise: Tensor, context: Tensor) -> Tensor:
        """The deterministic map from base noise ``(..., dim)`` (standard normal draws) to samples of
        ``q(. | c)``, for ``context (..., context_dim)`` broadcasting with it."""
        return self.sample_and_log_prob(noise, context)[0]

    def sample_and_log_prob(self, noise: Tensor, context: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`sample`'s draws ``(..., dim)`` and their ``log q(x | c)`` (the broadcast batch shape) from the
        same pass through the flow (:meth:`log_prob`'s value to float rounding where the flow inverts well in its
        dtype), in about the time of :meth:`sample` alone."""
        noise, embedded, batch = self._broadcast(noise, context)
        if self.config.backend == "nflows":
            with _nflows_quiet():
                x, log_det = self.net._transform.inverse(noise, context=embedded)
            log_q = self.net._distribution.log_prob(noise, context=embedded) - log_det
        else:
            x, log_q = self.spline.sample_and_log_prob(noise, embedded)
        return x.reshape(batch + (self.dim,)), log_q.reshape(batch)

    def _broadcast(self, x: Tensor, context: Tensor) -> tuple[Tensor, Tensor, torch.Size]:
        """``x`` and the embedded context (z-scoring, then the embedding, applied once per row of ``context``
        before broadcasting) flattened to the broadcast batch, and that batch shape."""
        if x.shape[-1] != self.dim or context.shape[-1] != self.context_dim:
            raise ValueError(
                f"flow expects inputs (..., {self.dim}) and context (..., {self.context_dim}), "
                f"got {tuple(x.shape)} and {tuple(context.shape)}"
            )
        batch = torch.broadcast_shapes(x.shape[:-1], context.shape[:-1])
        embedded = self._embed(context.reshape(-1, self.context_dim))
        embedded = embedded.reshape(context.shape[:-1] + embedded.shape[-1:])
        x = x.expand(batch + (self.dim,)).reshape(-1, self.dim)
        embedded = embedded.expand(batch + embedded.shape[-1:]).reshape(-1, embedded.shape[-1])
        return x, embedded, batch

    def _embed(self, context: Tensor) -> Tensor:
        """The embedded context ``(n, features)`` of ``context (n, context_dim)``: its z-scoring (the first module
        of the embedding) in the context's own precision, the rest in the flow's :attr:`dtype`."""
        net, context = self.context_net, self._prepared(context)
        if not isinstance(net, nn.Sequential) or len(net) == 0:
            return net(context.to(self.dtype))
        embedded = _z_scored(net[0], context, self.dtype).to(self.dtype)
        for module in list(net)[1:]:
            embedded = module(embedded)
        return embedded


#: The z-scoring modules that come first: of nflows' inputs and of the context (sbi's ``Standardize``).
_Z_SCORING = (PointwiseAffineTransform, Standardize, EpsilonStandardize)


def _z_scored(module: nn.Module, x: Tensor, dtype: torch.dtype, *args):
    """``module(x, *args)``: a z-scoring module (:data:`_Z_SCORING`) computes in ``x``'s precision where it is
    wider than the flow's ``dtype`` (float64 counts beyond 2^24 keep their last digits until they are centred
    and scaled; the caller converts the result), any other module on ``x`` in ``dtype``."""
    wide = x.dtype.itemsize > dtype.itemsize and isinstance(module, _Z_SCORING)
    return module(x if wide else x.to(dtype), *args)


def _nflows(config: FlowSettings, inputs: Tensor, context: Tensor) -> nn.Module:
    """sbi's ``build_nsf`` network on nflows (backend ``"nflows"``)."""
    from sbi.neural_nets.net_builders.flow import build_nsf

    return build_nsf(
        inputs,
        context,
        z_score_x="independent",
        z_score_y="independent",
        hidden_features=config.hidden,
        num_transforms=config.transforms,
        num_bins=config.bins,
        tail_bound=float(config.tail_bound),
        num_blocks=config.blocks,
        embedding_net=config.embedding_net(int(context.shape[1])),
    ).net


@contextlib.contextmanager
def _nflows_quiet():
    """nflows' LU transform calls ``torch.triangular_solve``, which torch deprecates; not our call, so that message
    is silenced during nflows' calls only (no filter outlives them)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"torch\.triangular_solve is deprecated")
        yield
