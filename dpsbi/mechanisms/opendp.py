"""The OpenDP front door: a measurement built with OpenDP turned into the dpsbi mechanism that models it.

OpenDP is an optional extra: ``pip install "dpsbi[opendp]"``.
"""

from __future__ import annotations

import math

from .base import Mechanism
from .composition import Composition
from .discrete import DiscreteGaussian, DiscreteLaplace
from .gaussian import Gaussian
from .laplace import Laplace

SUPPORTED = (
    "measurements built by OpenDP's make_laplace, make_geometric (MaxDivergence) or make_gaussian "
    "(ZeroConcentratedDivergence) directly on a number (atom_domain, absolute_distance) or a vector "
    "(vector_domain(atom_domain), l1_distance for Laplace, l2_distance for Gaussian) of integers or floats"
)
#: OpenDP combinators whose measurement releases every part's output on the same input (their ``measurements``).
_COMPOSITIONS = {"make_composition", "make_basic_composition"}
_INTERACTIVE = {"make_sequential_composition", "make_adaptive_composition", "make_fully_adaptive_composition"}
_INTEGERS = {"i16", "i32", "i64", "i128", "isize", "u8", "u16", "u32", "u64", "u128", "usize"}
_FLOATS = {"f32", "f64"}


def _refuse(what: str) -> ValueError:
    return ValueError(f"from_opendp supports {SUPPORTED}; got {what}")


def from_opendp(
    measurement, sensitivity: float, dim: int | list[int] | None = None, *, delta: float = 1e-6
) -> Mechanism:
    """The dpsbi mechanism of an OpenDP ``measurement`` applied to a statistic of the given ``sensitivity``
    (its input distance: absolute for a number, L1 / L2 for a vector).

    A ``make_composition`` of such measurements (on the same input, so the same ``sensitivity``) becomes a
    :class:`~dpsbi.mechanisms.Composition` of their mechanisms, one block per part in order (``dim``: one for
    all parts or a list, one per part; ``delta`` shared evenly by the zCDP parts, so that the composition states
    its epsilon at ``delta``); a part converted by ``make_pureDP_to_zCDP`` is its inner measurement (the same
    noise; the composition's accounting converts it). An unsupported part is refused in one line naming it.

    Integer domains give :class:`DiscreteLaplace` / :class:`DiscreteGaussian`, float domains :class:`Laplace` /
    :class:`Gaussian`. The noise scale is read off the privacy map: ``epsilon = measurement.map(sensitivity)``
    gives the Laplace scale ``sensitivity / epsilon``; ``rho = measurement.map(sensitivity)`` the Gaussian
    ``sigma = sensitivity / sqrt(2 rho)``. ``dim`` is needed for vectors of unspecified size. A zCDP (Gaussian)
    mechanism states its ``epsilon`` at ``delta``. Anything else is refused, in one line saying what is supported.
    """
    try:
        from opendp.mod import AtomDomain, Measurement, VectorDomain
    except ImportError as error:
        raise ImportError(f'from_opendp needs OpenDP: pip install "dpsbi[opendp]" ({error})') from None
    if not isinstance(measurement, Measurement):
        raise _refuse(f"a {type(measurement).__name__}, not an OpenDP Measurement")
    measurement = _unconverted(measurement)
    function = _made_by(measurement)[0]
    if function in _INTERACTIVE:
        raise ValueError(
            f"from_opendp: {function} is interactive (its queries are chosen as it runs); compose the "
            "measurements up front with make_composition"
        )
    if function in _COMPOSITIONS:
        return _composition(_made_by(measurement)[1]["measurements"], sensitivity, dim, delta)
    domain, metric = measurement.input_domain, str(measurement.input_metric.type)
    measure = str(measurement.output_measure.type)
    vector = isinstance(domain, VectorDomain) and isinstance(domain.element_domain, AtomDomain)
    if not (vector or isinstance(domain, AtomDomain)):
        raise _refuse(f"input domain {domain!r}")
    laplace, gaussian = ("L1Distance", "L2Distance") if vector else ("AbsoluteDistance", "AbsoluteDistance")
    metrics = {"MaxDivergence": laplace, "ZeroConcentratedDivergence": gaussian}
    if measure not in metrics:
        raise _refuse(f"output measure {measure}")
    if not metric.startswith(metrics[measure] + "<"):
        raise _refuse(f"input metric {metric} with output measure {measure}")
    carrier = str((domain.element_domain if vector else domain).carrier_type)
    if carrier not in _INTEGERS | _FLOATS:
        raise _refuse(f"elements of type {carrier}")
    if vector:
        size = domain.size
        if dim is None and size is None:
            raise ValueError(f"from_opendp: {domain!r} does not fix the vector's size; pass dim")
        if dim is not None and size is not None and int(dim) != size:
            raise ValueError(f"from_opendp: dim={dim} disagrees with {domain!r}")
        dim = int(size if dim is None else dim)
    elif dim not in (None, 1):
        raise ValueError(f"from_opendp: a measurement on {domain!r} releases one number, got dim={dim}")
    else:
        dim = 1
    integer = carrier in _INTEGERS
    sensitivity = float(sensitivity)
    if not math.isfinite(sensitivity) or sensitivity <= 0:
        raise ValueError(f"sensitivity must be a finite number > 0, got {sensitivity}")
    if str(measurement.input_distance_type) in _INTEGERS:
        if sensitivity != math.floor(sensitivity):
            raise ValueError(f"sensitivity must be an integer for the metric {metric}, got {sensitivity:g}")
        d_in, double = int(sensitivity), 2 * int(sensitivity)
    else:
        d_in, double = sensitivity, 2 * sensitivity
    loss, loss2 = float(measurement.map(d_in)), float(measurement.map(double))
    power = 1 if measure == "MaxDivergence" else 2  # epsilon = d / scale; rho = d^2 / (2 sigma^2)
    if not (math.isfinite(loss) and loss > 0 and math.isclose(loss2, 2**power * loss, rel_tol=1e-6)):
        raise _refuse(
            f"a privacy map with map({d_in}) = {loss:g}, map({double}) = {loss2:g}, not that of Laplace or Gaussian noise"
        )
    if measure == "MaxDivergence":
        scale = sensitivity / loss
        family = DiscreteLaplace if integer else Laplace
        return family.from_scale(scale, sensitivity, dim)
    sigma = sensitivity / math.sqrt(2 * loss)
    if integer:
        mech = DiscreteGaussian.from_sigma(sigma, sensitivity, dim, delta=delta)
        mech.rho = loss
        return mech
    return Gaussian.from_sigma(sigma, sensitivity, dim, delta=delta)


def _made_by(measurement) -> tuple[str | None, dict]:
    """The OpenDP constructor that made ``measurement`` and its keyword arguments (``(None, {})`` if unknown)."""
    record = getattr(measurement, "__opendp_dict__", None) or {}
    return record.get("__function__"), record.get("__kwargs__", {})


def _unconverted(measurement):
    """``measurement`` less any ``make_pureDP_to_zCDP`` around it (a change of guarantee, not of noise)."""
    while _made_by(measurement)[0] == "make_pureDP_to_zCDP":
        measurement = _made_by(measurement)[1]["measurement"]
    return measurement


def _composition(parts, sensitivity: float, dim, delta: float) -> Composition:
    """The :class:`Composition` of the dpsbi mechanisms of an OpenDP composition's ``parts``."""
    parts = [_unconverted(p) for p in parts]
    dims = list(dim) if isinstance(dim, (list, tuple)) else [dim] * len(parts)
    if len(dims) != len(parts):
        raise ValueError(
            f"from_opendp: dim lists {len(dims)} block sizes for a composition of {len(parts)} parts"
        )
    zcdp = sum(str(p.output_measure.type) == "ZeroConcentratedDivergence" for p in parts)
    blocks = []
    for j, (part, size) in enumerate(zip(parts, dims)):
        try:
            blocks.append(from_opendp(part, sensitivity, size, delta=delta / max(zcdp, 1)))
        except ValueError as error:
            raise ValueError(f"from_opendp: part {j} of the composition: {error}") from None
    return Composition(blocks)
