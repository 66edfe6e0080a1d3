"""Variance-stabilizing maps of releases: the binomial's arcsine evens out its noise's spread (exact moments), the
flow applies it before z-scoring to the coordinates whose mechanism names it, only where a posterior flow is
conditioned on ``log epsilon``, and saved files and old records keep what they had."""

import json
import math

import pytest
import torch

import dpsbi
from dpsbi.inference.flows import ConditionalFlow, FlowSettings
from dpsbi.mechanisms import BinomialCurve, Composition, Laplace
from dpsbi.mechanisms.binomial import binomial_log_pmf
from dpsbi.mechanisms.stabilizing import STABILIZING_MAPS, Stabilizer, arcsine

TINY = dict(flow=dict(transforms=1, hidden=8), training=dict(max_steps=5), progress=False)


def _sd(values: torch.Tensor, n: int, p: float) -> float:
    """Exact sd of ``values[k]`` under ``k ~ Bin(n, p)``."""
    k = torch.arange(n + 1, dtype=torch.float64)
    w = binomial_log_pmf(k, n, torch.tensor(p, dtype=torch.float64)).exp()
    mean = (w * values).sum()
    return float((w * (values - mean) ** 2).sum().sqrt())


def test_the_arcsine_evens_out_a_binomial_release_spread_across_its_probability():
    """N = 1000 trials, p from 0.01 (SIR's curve at epsilon 10 before and after the peak) to 0.5: the release's sd
    spans 5x, its arcsine's stays within 10 % of ``1 / (2 sqrt N)``."""
    n = 1000
    y = torch.arange(n + 1, dtype=torch.float64) / n
    raw = [_sd(y, n, p) for p in (0.01, 0.05, 0.2, 0.5)]
    mapped = [_sd(arcsine(y), n, p) for p in (0.01, 0.05, 0.2, 0.5)]
    assert max(raw) / min(raw) > 4.9
    assert all(abs(sd * 2 * math.sqrt(n) - 1) < 0.1 for sd in mapped), mapped


def test_the_stabilizer_maps_only_the_named_columns_and_keeps_the_state_dict():
    maps = Stabilizer(("arcsine", None, "arcsine"), 4)  # a 3-column release and log epsilon
    y = torch.tensor([[0.25, 0.25, 1.5, -2.0], [0.0, 0.7, -0.1, 2.3]])
    out = maps(y)
    expected = y.clone()
    expected[:, [0, 2]] = torch.asin(y[:, [0, 2]].clamp(0, 1).sqrt())
    assert torch.equal(out, expected)
    assert maps.state_dict() == {}
    assert torch.equal(Stabilizer((), 4)(y), y)
    with pytest.raises(ValueError, match="unknown stabilizing map 'logit'"):
        Stabilizer(("logit",), 2)
    assert sorted(STABILIZING_MAPS) == ["arcsine"]


def test_mechanisms_name_their_maps_block_by_block():
    curve = BinomialCurve(100, 10_000, 3, epsilon=1.0)
    assert curve.stabilizing_maps == ("arcsine",) * 3
    assert Laplace(1.0, 1.0, 2).stabilizing_maps == (None, None)
    both = Composition([Laplace(1.0, 1.0, 1), curve])
    assert both.stabilizing_maps == (None, "arcsine", "arcsine", "arcsine")
    assert dpsbi.mechanisms.PostProcessed(curve, lambda y: y * 2).stabilizing_maps == (None,) * 3


def test_a_flow_with_the_map_is_the_flow_on_mapped_releases():
    """The map comes before z-scoring: a flow built with it equals one built (same seed) on mapped releases."""
    gen = torch.Generator().manual_seed(0)
    theta, release = torch.randn(200, 2, generator=gen), torch.rand(200, 3, generator=gen) ** 3
    log_eps = torch.rand(200, 1, generator=gen) * 4 - 2
    context = torch.cat([release, log_eps], -1)
    mapped = torch.cat([arcsine(release), log_eps], -1)
    config = FlowSettings(transforms=2, hidden=8)
    torch.manual_seed(1)
    with_map = ConditionalFlow(config, theta, context, True, stabilizing_maps=("arcsine",) * 3)
    torch.manual_seed(1)
    on_mapped = ConditionalFlow(config, theta, mapped, True)
    assert torch.allclose(
        with_map.log_prob(theta[:20], context[:20]), on_mapped.log_prob(theta[:20], mapped[:20])
    )
    noise = torch.randn(20, 2, generator=gen)
    assert torch.allclose(with_map.sample(noise, context[:20]), on_mapped.sample(noise, mapped[:20]))


def _task():
    """Two infected fractions of 10 000 through the binomial curve: a cheap simulator, a task to fit in seconds."""
    prior = dpsbi.tasks.custom.box([0.01, 0.01], [0.5, 0.5])

    def simulate(theta, generator=None):
        return (theta * 10_000).round()

    mechanism = BinomialCurve(100, 10_000, 2, epsilon=1.0)
    return dpsbi.tasks.custom.from_simulator(prior, simulate, mechanism, [0.2, 0.1])


@pytest.fixture(scope="module")
def fits():
    task = _task()
    runs = {}
    for name, options in {
        "range": dict(amortized=True, epsilon_range=(0.5, 5.0)),
        "fixed": dict(amortized=True),
        "off": dict(
            amortized=True, epsilon_range=(0.5, 5.0), flow={**TINY["flow"], "stabilize_release": False}
        ),
    }.items():
        estimator = dpsbi.SPPE(task, rounds=1, sims_per_round=300, seed=0, **{**TINY, **options})
        runs[name] = estimator.run()
    return task, runs


def test_only_a_posterior_flow_conditioned_on_epsilon_stabilizes_and_its_file_keeps_the_map(fits, tmp_path):
    task, runs = fits
    assert runs["range"].flow.stabilizing_maps == ("arcsine", "arcsine")
    assert runs["fixed"].flow.stabilizing_maps == ()
    assert runs["off"].flow.stabilizing_maps == ()
    path = tmp_path / "stabilized.pt"
    runs["range"].save(path)
    loaded = dpsbi.load_posterior(path, task=task)
    assert loaded.flow.stabilizing_maps == ("arcsine", "arcsine")
    y = torch.tensor([[0.3, 0.05]])
    draws = runs["range"].sample((40,), y=y, epsilon=2.0, seed=3)
    assert torch.equal(loaded.sample((40,), y=y, epsilon=2.0, seed=3), draws)


def test_files_written_before_the_map_existed_load_without_it():
    assert FlowSettings.recorded({}).stabilize_release is False
    assert FlowSettings().stabilize_release is True


def _without_the_setting(directory) -> None:
    """Rewrite the checkpoint in ``directory`` as one written before ``stabilize_release`` existed."""
    from dpsbi.files import load_sealed, save_sealed
    from dpsbi.inference import checkpoint

    file = checkpoint.path(directory)
    payload = load_sealed(file, "dpsbi checkpoint")
    fingerprint = json.loads(payload["fingerprint"])
    del fingerprint["flow"]["stabilize_release"]
    save_sealed({**payload, "fingerprint": json.dumps(fingerprint)}, file)


def test_a_checkpoint_written_before_the_map_existed_resumes_without_it_and_only_so(tmp_path):
    """Its fingerprint lacks ``stabilize_release``: read as ``False`` (what it trained), so the run resumes with
    ``stabilize_release=False`` and is refused, naming the setting, with the default."""
    task, options = (
        _task(),
        dict(amortized=True, epsilon_range=(0.5, 5.0), rounds=1, sims_per_round=300, seed=0),
    )
    off = {**TINY, "flow": {**TINY["flow"], "stabilize_release": False}}
    first = dpsbi.SPPE(task, checkpoint_dir=tmp_path, **options, **off).run()
    _without_the_setting(tmp_path)
    resumed = dpsbi.SPPE(task, checkpoint_dir=tmp_path, **options, **off).run()
    y = torch.tensor([[0.3, 0.05]])
    assert torch.equal(
        resumed.sample((40,), y=y, epsilon=2.0, seed=3), first.sample((40,), y=y, epsilon=2.0, seed=3)
    )
    with pytest.raises(ValueError, match=r"different run \(flow\.stabilize_release: False vs True\)"):
        dpsbi.SPPE(task, checkpoint_dir=tmp_path, **options, **TINY).run()


def test_the_map_makes_no_host_decision():
    """A stabilized flow's ``log_prob`` traces as one graph (``fullgraph``: no data-dependent Python branch)."""
    gen = torch.Generator().manual_seed(0)
    theta, context = torch.randn(50, 2, generator=gen), torch.rand(50, 3, generator=gen)
    flow = ConditionalFlow(
        FlowSettings(transforms=1, hidden=8), theta, context, True, stabilizing_maps=("arcsine",) * 2
    )
    traced = torch.compile(flow.log_prob, backend="eager", fullgraph=True)
    assert torch.allclose(traced(theta, context), flow.log_prob(theta, context))


def test_a_checkpoint_without_the_setting_resumes_at_the_defaults_where_no_map_applies(tmp_path):
    """Laplace noise names no map: the setting changes nothing there, and such a checkpoint resumes as before."""
    task = dpsbi.tasks.load("poisson_counts", epsilon=0.5, y_obs="simulate")
    options = dict(amortized=True, epsilon_range=(0.2, 2.0), rounds=1, sims_per_round=300, seed=0, **TINY)
    first = dpsbi.SPPE(task, checkpoint_dir=tmp_path, **options).run()
    _without_the_setting(tmp_path)
    resumed = dpsbi.SPPE(task, checkpoint_dir=tmp_path, **options).run()
    y = torch.tensor([[3.0]])
    assert torch.equal(
        resumed.sample((40,), y=y, epsilon=1.0, seed=3), first.sample((40,), y=y, epsilon=1.0, seed=3)
    )
