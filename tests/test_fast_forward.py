"""The faster forwards (layers/prepack.py, layers/compiled.py) serve the same tokens as the model as written."""

from __future__ import annotations

import argparse
import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minillm.bench.peer import forward_of
from minillm.layers.compiled import CompiledForward, speed_up
from minillm.layers.prepack import PrepackedLinear, can_prepack
from minillm.layers.reference import generate
from minillm.model.checkpoint import load_model
from minillm.model.transformer import Transformer
from minillm.runs.run import workload_engine
from minillm.runs.workload import ChatKnobs, make_workload

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
CROWD = ChatKnobs(requests=24, rate=1000)


@pytest.fixture(scope="module")
def plain() -> Transformer:
    return load_model(None, "cpu")


def crowd_replies(model: Transformer, seats: int = 8) -> list[list[int]]:
    engine = workload_engine(model, "chat", "continuous", slots=seats, knobs=CROWD, seed=23)
    return [r.output_ids for r in engine.run().requests]


@pytest.fixture(scope="module")
def plain_replies(plain) -> list[list[int]]:
    """The crowd's replies from the model as written: what every faster forward must serve."""
    return crowd_replies(plain)


@needs_onednn
def test_a_prepacked_linear_computes_what_linear_does():
    torch.manual_seed(0)
    linear = nn.Linear(48, 80)
    packed = PrepackedLinear(linear)
    for shape in [(1, 48), (7, 48), (2, 5, 48)]:
        x = torch.randn(shape)
        torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), atol=1e-5, rtol=1e-5)


@needs_onednn
def test_a_prepacked_model_keeps_its_names_and_travels(plain):
    """Checkpoints and export read the same state_dict; a copy or a pickle lays its weights out again."""
    model = forward_of(plain, "prepacked")
    assert sum(isinstance(m, PrepackedLinear) for m in model.modules()) == 4 * plain.cfg.n_layers + 1
    assert model.state_dict().keys() == plain.state_dict().keys()
    tokens = torch.tensor([[5, 17, 42, 8]])
    expected = model(tokens)
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        torch.testing.assert_close(other(tokens), expected)


@needs_onednn
def test_prepacked_serves_the_same_tokens(plain, plain_replies):
    model = forward_of(plain, "prepacked")
    assert can_prepack(model) and model.forward_kind == "prepacked"
    replies = crowd_replies(model)
    assert replies == plain_replies
    request = make_workload("chat", CROWD, 23)[0]  # the engine = the plain loop
    assert generate(model, request.prompt_ids, request.max_new_tokens, use_cache=False).tokens == replies[0]


def test_compiled_serves_the_same_tokens_in_one_graph(plain, plain_replies):
    """One graph for every step (one user alone first, whose steps have one row; then a crowd of decode rows and
    prompt chunks), compiled before the first step; the compiled forward never gave up."""
    from torch._dynamo.utils import counters

    model = forward_of(plain, "compiled")
    assert isinstance(model.forward, CompiledForward) and model.forward.compile_s is None
    graphs = counters["stats"]["unique_graphs"]
    one = ChatKnobs(requests=1, rate=1000)
    alone = [workload_engine(m, "chat", "continuous", slots=4, knobs=one, seed=5).run().requests[0].output_ids
             for m in (model, plain)]  # fmt: skip
    assert alone[0] == alone[1] and model.forward.compiled is not None
    replies = crowd_replies(model)
    assert replies == plain_replies
    assert counters["stats"]["unique_graphs"] - graphs == 1, "a step compiled the forward again"
    assert model.forward.compile_s > 0 and model.forward.compiled is not None
    request = make_workload("chat", CROWD, 23)[0]  # without a cache: the plain forward, the same tokens
    assert generate(model, request.prompt_ids, request.max_new_tokens, use_cache=False).tokens == replies[0]


def test_an_unknown_forward_is_refused(plain):
    with pytest.raises(ValueError, match="plain, prepacked, compiled"):
        speed_up(copy.deepcopy(plain), "fast")


@pytest.mark.parametrize(("flags", "forward"), [({}, "prepacked"), ({"plain_matmul": True}, "plain")])
def test_the_cli_loads_the_forward_its_flags_ask_for(flags, forward):
    from minillm.cli.args import load_model_from

    args = argparse.Namespace(checkpoint=None, device="cpu", **flags)
    expected = forward if forward != "prepacked" or torch.backends.mkldnn.is_available() else "plain"
    assert load_model_from(args).forward_kind == expected
    assert load_model_from(args, default_forward="plain").forward_kind == "plain"  # (what bench measures)


def test_the_cli_compiles_before_the_first_step_and_says_how_long(capsys):
    """--compile: compiled at load, so no step's time (a TTFT, a bench's run) holds the compile."""
    from minillm.cli.args import load_model_from

    model = load_model_from(argparse.Namespace(checkpoint=None, device="cpu", compile=True))
    assert model.forward_kind == "compiled" and model.forward.compile_s > 0 and model.forward.compiled is not None
    assert f"compiled in {model.forward.compile_s:.0f} s" in capsys.readouterr().err


def test_serve_builds_the_same_forward_in_its_engine_process(server, client, shipped_model):
    """The engine process gets the weights and the forward's name, and lays the weights out again itself; its replies
    are the plain model's (the server tests check many more on the same server)."""
    forward = "prepacked" if torch.backends.mkldnn.is_available() else "plain"
    assert server.loop.config["forward"] == forward
    prompt = make_workload("chat", CROWD, 23)[1].prompt_ids
    body = {"prompt": prompt, "max_tokens": 40, "return_token_ids": True}
    reply = client.post(f"{server.url}/completions", json=body).json()["choices"][0]["token_ids"]
    assert reply == generate(shipped_model, prompt, 40, use_cache=False).tokens
