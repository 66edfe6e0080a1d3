"""The OpenDP front door: measurements built with OpenDP become the dpsbi mechanisms with the same noise."""

from __future__ import annotations

import math
import sys

import pytest

from dpsbi.mechanisms import DiscreteGaussian, DiscreteLaplace, Gaussian, Laplace, from_opendp

dp = pytest.importorskip("opendp.prelude")
dp.enable_features("contrib")
# OpenDP 0.13 names it make_basic_composition (from_opendp reads either name)
compose = getattr(dp.c, "make_composition", None) or dp.c.make_basic_composition


def one_line(error) -> bool:
    return "\n" not in str(error.value)


def test_integer_laplace_becomes_discrete_laplace():
    scalar = dp.m.make_laplace(dp.atom_domain(T=int), dp.absolute_distance(T=int), scale=2.5)
    mech = from_opendp(scalar, sensitivity=1)
    assert isinstance(mech, DiscreteLaplace) and mech.dim == 1
    assert mech.scale == pytest.approx(2.5, rel=1e-15) and mech.epsilon == pytest.approx(
        scalar.map(1), rel=1e-15
    )
    vector = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int), scale=4.0)
    mech = from_opendp(vector, sensitivity=2, dim=5)
    assert (
        isinstance(mech, DiscreteLaplace)
        and mech.dim == 5
        and mech.scale == pytest.approx(4.0, rel=1e-15)
        and mech.sensitivity == 2
    )
    geometric = dp.m.make_geometric(dp.atom_domain(T=int), dp.absolute_distance(T=int), scale=3.0)
    assert from_opendp(geometric, 1).scale == pytest.approx(3.0, rel=1e-15)


def test_integer_gaussian_becomes_discrete_gaussian():
    sized = dp.vector_domain(dp.atom_domain(T=int), size=3)
    measurement = dp.m.make_gaussian(sized, dp.l2_distance(T=int), scale=2.0)
    mech = from_opendp(measurement, sensitivity=2, delta=1e-7)
    assert isinstance(mech, DiscreteGaussian) and mech.dim == 3 and mech.delta == 1e-7
    assert mech.sigma == pytest.approx(2.0, rel=1e-15) and mech.rho == measurement.map(2) == 0.5
    scalar = dp.m.make_gaussian(dp.atom_domain(T=int), dp.absolute_distance(T=int), scale=3.0)
    assert from_opendp(scalar, 1).sigma == pytest.approx(3.0, rel=1e-15)


def test_float_domains_become_continuous_mechanisms():
    laplace = dp.m.make_laplace(dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=1.5)
    mech = from_opendp(laplace, sensitivity=0.3)
    assert (
        isinstance(mech, Laplace)
        and mech.scale == pytest.approx(1.5, rel=1e-15)
        and mech.epsilon == pytest.approx(0.2)
    )
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=4)
    gaussian = dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=2.0)
    mech = from_opendp(gaussian, sensitivity=1.0)
    assert isinstance(mech, Gaussian) and mech.dim == 4 and mech.sigma == pytest.approx(2.0, rel=1e-15)
    assert mech.rho == pytest.approx(gaussian.map(1.0), rel=1e-12)


@pytest.mark.parametrize(
    "build, sensitivity, dim, match",
    [
        (lambda: dp.m.make_randomized_response_bool(0.75), 1, None, "input metric DiscreteDistance"),
        (
            lambda: (
                dp.t.make_sum(dp.vector_domain(dp.atom_domain(bounds=(0, 10))), dp.symmetric_distance())
                >> dp.m.then_laplace(scale=1.0)
            ),
            1,
            None,
            "input metric SymmetricDistance",
        ),
        (
            lambda: dp.t.make_sum(dp.vector_domain(dp.atom_domain(bounds=(0, 10))), dp.symmetric_distance()),
            1,
            None,
            "not an OpenDP Measurement",
        ),
        (
            lambda: dp.c.make_zCDP_to_approxDP(
                dp.m.make_gaussian(dp.atom_domain(T=int), dp.absolute_distance(T=int), scale=2.0)
            ),
            1,
            None,
            "output measure",
        ),
        (lambda: "laplace", 1, None, "not an OpenDP Measurement"),
    ],
)
def test_other_measurements_are_refused_in_one_line(build, sensitivity, dim, match):
    with pytest.raises(ValueError, match=match) as error:
        from_opendp(build(), sensitivity, dim)
    assert one_line(error) and "make_laplace" in str(error.value) and "make_gaussian" in str(error.value)


def test_bad_arguments_are_refused_in_one_line():
    unsized = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int), scale=1.0)
    sized = dp.m.make_laplace(
        dp.vector_domain(dp.atom_domain(T=int), size=3), dp.l1_distance(T=int), scale=1.0
    )
    scalar = dp.m.make_laplace(dp.atom_domain(T=int), dp.absolute_distance(T=int), scale=1.0)
    for call, match in [
        (lambda: from_opendp(unsized, 1), "pass dim"),
        (lambda: from_opendp(sized, 1, dim=4), "dim=4 disagrees"),
        (lambda: from_opendp(scalar, 1, dim=2), "one number"),
        (lambda: from_opendp(scalar, 1.5), "sensitivity must be an integer"),
        (lambda: from_opendp(scalar, -1), "sensitivity must be a finite number > 0"),
    ]:
        with pytest.raises(ValueError, match=match) as error:
            call()
        assert one_line(error)


def test_missing_opendp_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "opendp.mod", None)  # import opendp.mod raises ImportError
    with pytest.raises(ImportError, match='pip install "dpsbi\\[opendp\\]"') as error:
        from_opendp(object(), 1)
    assert one_line(error)


def test_noise_scales_agree_with_opendp_draws():
    # The mechanism's own variance against OpenDP's samples: 20 000 draws, 5 standard errors (OpenDP's
    # sampler is not seedable; the comparison of whole distributions is in test_discrete_mechanisms.py).
    domain = dp.vector_domain(dp.atom_domain(T=int), size=20000)
    measurement = dp.m.make_laplace(domain, dp.l1_distance(T=int), scale=3.0)
    mech = from_opendp(measurement, sensitivity=1)
    draws = [float(v) for v in measurement([0] * 20000)]
    variance = 2 * mech.p / (1 - mech.p) ** 2
    observed = sum(v * v for v in draws) / len(draws)
    assert abs(observed - variance) < 5 * math.sqrt(
        20 * variance**2 / len(draws)
    )  # 4th moment of DLap < 20 var^2


def test_a_composition_becomes_a_composition_of_its_parts():
    """make_composition of a float Laplace (converted to zCDP), a float Gaussian and an integer Gaussian on vectors."""
    floats = (dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float))
    laplace = dp.m.make_laplace(*floats, scale=2.0)
    parts = [dp.c.make_pureDP_to_zCDP(laplace), dp.m.make_gaussian(*floats, scale=3.0)]
    composed = compose(parts)
    mech = from_opendp(composed, sensitivity=1.0, delta=1e-6)
    assert [type(b) for b in mech.blocks] == [Laplace, Gaussian] and mech.dim == 2
    assert mech.blocks[0].scale == pytest.approx(2.0) and mech.blocks[1].sigma == pytest.approx(3.0)
    assert mech.rho == pytest.approx(composed.map(1.0), rel=1e-12) and mech.delta == pytest.approx(1e-6)
    pure = compose([laplace, dp.m.make_laplace(*floats, scale=0.5)])
    assert from_opendp(pure, 1.0).epsilon == pytest.approx(pure.map(1.0), rel=1e-12)
    vectors = dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int)
    counts = compose([dp.m.make_gaussian(*vectors, scale=2.0), dp.m.make_gaussian(*vectors, scale=4.0)])
    mech = from_opendp(counts, sensitivity=1, dim=[3, 2])
    assert [b.dim for b in mech.blocks] == [3, 2] and all(
        isinstance(b, DiscreteGaussian) for b in mech.blocks
    )
    assert mech.rho == pytest.approx(counts.map(1), rel=1e-12)


def test_an_unsupported_part_of_a_composition_is_named():
    floats = (dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float))
    chained = dp.t.make_sum(dp.vector_domain(dp.atom_domain(bounds=(0.0, 1.0))), dp.symmetric_distance())
    composed = compose([chained >> dp.m.then_laplace(1.0), chained >> dp.m.then_laplace(2.0)])
    with pytest.raises(
        ValueError, match="^from_opendp: part 0 of the composition: from_opendp supports"
    ) as error:
        from_opendp(composed, sensitivity=1)
    assert one_line(error)
    laplace = dp.m.make_laplace(*floats, scale=2.0)
    with pytest.raises(ValueError, match="dim lists 3 block sizes for a composition of 2 parts"):
        from_opendp(compose([laplace, laplace]), 1.0, dim=[1, 1, 1])
