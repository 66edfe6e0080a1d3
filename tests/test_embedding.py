"""Embedding networks for the flows' conditioning input (``FlowSettings(embedding=...)``): a named default and sbi's
embedding nets with SPPE, densities unchanged by embedding the context before broadcasting, and what saving
and checkpointing do with each."""

import json

import pytest
import torch
from sbi.neural_nets.embedding_nets import FCEmbedding

import dpsbi
from dpsbi.inference import ConditionalFlow, FlowSettings, load_posterior

TINY = dict(sims_per_round=100, training=dict(max_steps=5), progress=False)


@pytest.fixture(scope="module")
def task():
    return dpsbi.tasks.load("census_table", age_groups=5)  # 10 cells


def _flow(config, dim=3, context_dim=10, seed=0):
    torch.manual_seed(seed)
    return ConditionalFlow(config, torch.randn(64, dim), torch.rand(64, context_dim) * 20)


@pytest.mark.parametrize("backend", ["dpsbi", "nflows"])
@pytest.mark.parametrize(
    "embedding", [None, "mlp", FCEmbedding(10, output_dim=6, num_layers=2, num_hiddens=16)]
)
def test_densities_and_samples_are_the_backends_own_with_the_context_embedded_once(embedding, backend):
    flow = _flow(FlowSettings(transforms=2, hidden=8, embedding=embedding, backend=backend))
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.1 * torch.randn(p.shape))
    x, context = torch.randn(5, 1, 4, 3), torch.rand(5, 7, 1, 10) * 20  # broadcast to (5, 7, 4)
    flat_x, flat_c = x.expand(5, 7, 4, 3).reshape(-1, 3), context.expand(5, 7, 4, 10).reshape(-1, 10)
    noise = torch.randn(5, 7, 4, 3)
    embedded = flow.context_net(flat_c)
    if backend == "nflows":
        expected = flow.net.log_prob(flat_x, context=flat_c)
        expected_x, _ = flow.net._transform.inverse(noise.reshape(-1, 3), context=embedded)
    else:
        expected = flow.spline.log_prob(flat_x, embedded)
        expected_x, _ = flow.spline.sample_and_log_prob(noise.reshape(-1, 3), embedded)
    assert torch.allclose(flow.log_prob(x, context), expected.reshape(5, 7, 4), atol=1e-5)
    assert torch.allclose(flow.sample(noise, context), expected_x.reshape(5, 7, 4, 3), atol=1e-5)


def test_named_and_module_embeddings_are_part_of_the_flow():
    plain = _flow(FlowSettings(transforms=2, hidden=8))
    named = _flow(FlowSettings(transforms=2, hidden=8, embedding="mlp"))
    module = FCEmbedding(10, output_dim=6, num_layers=2, num_hiddens=16)
    config = FlowSettings(transforms=2, hidden=8, embedding=module)
    one, two = _flow(config), _flow(config)
    count = lambda f: sum(p.numel() for p in f.parameters())  # noqa: E731
    assert count(named) > count(plain) + 10 * 100  # the MLP's first layer alone
    # the module's weights join the flow's, whose conditioners now see 6 features, not 10: each of the 2 transforms'
    # residual nets has an input layer and 2 blocks taking the context, 8 units each
    assert count(one) == count(plain) - 2 * 3 * 8 * (10 - 6) + sum(p.numel() for p in module.parameters())
    # every flow gets its own copy: training one leaves the others and the user's module alone
    with torch.no_grad():
        next(one.context_net[1].parameters()).add_(1.0)
    assert not torch.equal(next(one.context_net[1].parameters()), next(module.parameters()))
    assert torch.equal(next(two.context_net[1].parameters()), next(module.parameters()))


def test_settings_as_json_and_refusals():
    assert FlowSettings.coerce(
        json.loads(json.dumps(FlowSettings(embedding="mlp").to_dict()))
    ) == FlowSettings(embedding="mlp")
    assert FlowSettings().to_dict()["embedding"] is None
    described = FlowSettings(embedding=FCEmbedding(10)).to_dict()["embedding"]
    assert described["module"] == "sbi.neural_nets.embedding_nets.fully_connected.FCEmbedding"
    assert "Linear(in_features=10" in described["architecture"]
    with pytest.raises(ValueError, match="user module .*FCEmbedding.*named embedding"):
        FlowSettings.coerce({"embedding": described})
    with pytest.raises(ValueError, match="unknown flow embedding 'cnn'"):
        FlowSettings(embedding="cnn")
    with pytest.raises(TypeError, match="nn.Module"):
        FlowSettings(embedding=3)
    with pytest.raises(ValueError, match=r"does not map the flow's context \(n, 10\)"):
        _flow(FlowSettings(embedding=FCEmbedding(7)))


@pytest.mark.parametrize("embedding", ["mlp", "module"])
def test_sppe_trains_with_an_embedding_and_saving_follows_the_kind(task, tmp_path, embedding):
    net = (
        FCEmbedding(task.dim_s, output_dim=8, num_layers=2, num_hiddens=32)
        if embedding == "module"
        else "mlp"
    )
    estimator = dpsbi.SPPE(task, rounds=2, flow=dict(embedding=net), checkpoint_dir=tmp_path / "run", **TINY)
    posterior = estimator.run()
    draws = posterior.sample((50,), seed=0)
    assert draws.shape == (50, 3) and torch.isfinite(draws).all()
    assert torch.isfinite(posterior.log_prob(draws)).all()
    fingerprint = estimator.fingerprint()["flow"]["embedding"]
    # a checkpoint resumes with the same embedding and refuses another
    again = dpsbi.SPPE(task, rounds=2, flow=dict(embedding=net), checkpoint_dir=tmp_path / "run", **TINY)
    assert torch.allclose(again.run().sample((50,), seed=0), draws)
    with pytest.raises(ValueError, match="different run.*embedding"):
        dpsbi.SPPE(task, rounds=2, checkpoint_dir=tmp_path / "run", **TINY).run()
    posterior.save(tmp_path / "p.pt")
    if embedding == "mlp":
        assert fingerprint == "mlp"
        loaded = load_posterior(tmp_path / "p.pt")
        assert torch.allclose(loaded.log_prob(draws), posterior.log_prob(draws), atol=1e-5)
    else:
        assert fingerprint["module"].endswith("FCEmbedding")
        with pytest.raises(ValueError, match="user module .*FCEmbedding"):
            load_posterior(tmp_path / "p.pt")
