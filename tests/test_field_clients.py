"""The field's own tools, run unmodified against `python -m minillm serve` on loopback: guidellm's synchronous and
constant-rate benchmarks (0 errors, and its token counts equal to the server's books and to `load`'s way of
counting) and lm-eval's `local-completions` on a loglikelihood task over a local file (its default token-id
requests; its log-likelihoods equal to one forward of the shipped model, to 1e-4).

Neither tool is a minillm dependency: each test is skipped unless its tool is found, on PATH or where an
environment variable says (each in a virtual environment of its own, docs/serving.md):

    MINILLM_GUIDELLM=/path/to/venv/bin/guidellm   (guidellm 0.8.1)
    MINILLM_LM_EVAL=/path/to/venv/bin/lm_eval     (lm-eval[api] 0.4.13, with transformers for its tokenizer)

Nothing is downloaded: the tokenizer is minillm's export (a folder with tokenizer.json), the data a file written
here, and the tools run with Hugging Face's offline switches. Every server and tool process ends, even on failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch

from minillm.bench.server import free_port, start_server
from minillm.model.tokenizer import encode, encode_prompt
from minillm.serving.export import export_llama

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
TOOL_LIMIT_S = 60


def tool(env_var: str, name: str) -> str:
    """The tool's executable, or a skip that says how to point at it."""
    found = os.environ.get(env_var) or shutil.which(name)
    if not found or not Path(found).exists():
        pytest.skip(f"{name} is not installed (no minillm dependency): set {env_var}=/path/to/{name}")
    return found


@contextmanager
def serving():
    """`python -m minillm serve` (the engine in a process of its own) on a free loopback port; stopped after."""
    port = free_port()
    try:
        server = start_server(port)
    except RuntimeError as e:
        pytest.skip(str(e))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


def run_tool(command: list[str], cwd: Path) -> str:
    """Run one tool in a session of its own; whatever it started is killed after, whatever happens."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=os.environ | OFFLINE, start_new_session=True)  # fmt: skip
    try:
        output, _ = process.communicate(timeout=TOOL_LIMIT_S)
    except subprocess.TimeoutExpired:
        output = "(timed out)"
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # its workers too (the group is the tool's own session)
        except ProcessLookupError:
            pass
        process.wait(10)
    assert process.returncode == 0, f"{command[0]} failed ({process.returncode}):\n{output[-3000:]}"
    return output


def books(url: str) -> dict[str, float]:
    """The server's own token counters (GET /metrics)."""
    lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
    names = ("minillm_prefill_tokens_total", "minillm_generation_tokens_total")
    return {line.split()[0]: float(line.split()[1]) for line in lines if line.split(" ")[0] in names}


@pytest.fixture(scope="module")
def exported(tmp_path_factory, shipped_model) -> Path:
    """The shipped model's export: the tokenizer.json folder the tools load (as `python -m minillm export`)."""
    folder = tmp_path_factory.mktemp("export")
    export_llama(shipped_model, folder)
    return folder


# --- guidellm ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["kind=synchronous", "kind=constant,rate=5"])
def test_guidellm_benchmarks_minillm_with_no_errors_and_the_servers_token_counts(tmp_path, exported, profile):
    guidellm = tool("MINILLM_GUIDELLM", "guidellm")
    requests, prompt_tokens, output_tokens = 16, 24, 16
    report = tmp_path / "benchmarks.json"
    with serving() as url:
        before = books(url)
        run_tool([guidellm, "run", "--backend", f"kind=openai_http,target={url}", "--profile", profile,
                  "--constraint", f"kind=max_requests,count={requests}", "--constraint", "kind=max_duration,seconds=30",
                  "--tokenizer", f"kind=huggingface_auto,model={exported}",
                  "--data", f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}",
                  "--output", f"kind=json,path={report}", "--disable-console-interactive"], tmp_path)  # fmt: skip
        after = books(url)
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    done = benchmark["requests"]
    assert (len(done["successful"]), len(done["errored"]), len(done["incomplete"])) == (requests, 0, 0)
    inputs = outputs = 0
    for r in done["successful"]:
        body = json.loads(r["request_args"])["body"]
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}  # as it always sends
        (message,) = body["messages"]
        (part,) = message["content"]
        # usage, as guidellm read it, is minillm's chat prompt (<bos> text <sep>) and the reply's bytes, which is how
        # `load` counts a reply (minillm's byte-level tokenizer over the text)
        assert r["input_metrics"]["text_tokens"] == len(encode_prompt(part["text"]))
        assert r["output_metrics"]["text_tokens"] == len(encode(r["output"])) == output_tokens  # ignore_eos: exact
        inputs += r["input_metrics"]["text_tokens"]
        outputs += r["output_metrics"]["text_tokens"]
    assert after["minillm_prefill_tokens_total"] - before["minillm_prefill_tokens_total"] == inputs
    assert after["minillm_generation_tokens_total"] - before["minillm_generation_tokens_total"] == outputs


# --- lm-eval -----------------------------------------------------------------------------------------
DOCS = [("count down from 5", " 5 4 3"), ("count down from 12", " 12 11 10 9"), ("spell 42", " forty-two"),
        ("spell 305", " three hundred five"), ("count down from 3", " banana"),
        ("Système: réponds ✓", " 🙂 ok")]  # fmt: skip

TASK = """task: minillm_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{continuation}}}}"
target_delimiter: ""
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def offline_loglikelihood(model, context: str, continuation: str) -> float:
    """What lm-eval asks for, computed here: one forward over the token ids it sends (context then continuation,
    no <bos>: its add_bos_token is False by default), the continuation tokens' log-softmax summed."""
    ids = encode(context) + encode(continuation)
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).double(), dim=-1)[0]
    return sum(logprobs[i - 1, ids[i]].item() for i in range(len(encode(context)), len(ids)))


def test_lm_eval_loglikelihoods_through_local_completions_equal_minillms_own(tmp_path, exported, shipped_model):
    lm_eval = tool("MINILLM_LM_EVAL", "lm_eval")
    data = tmp_path / "minillm_local.jsonl"
    data.write_text("".join(json.dumps({"context": c, "continuation": x}) + "\n" for c, x in DOCS))
    (tmp_path / "minillm_local.yaml").write_text(TASK.format(data=data))
    with serving() as url:
        run_tool([lm_eval, "--model", "local-completions", "--model_args",
                  f"model=minillm,base_url={url}/v1/completions,tokenizer={exported},num_concurrent=1,max_retries=1",
                  "--tasks", "minillm_local", "--include_path", str(tmp_path), "--output_path", str(tmp_path / "out"),
                  "--log_samples"], tmp_path)  # fmt: skip
    (samples,) = (tmp_path / "out").rglob("samples_minillm_local_*.jsonl")
    got = [json.loads(line) for line in samples.read_text().splitlines()]
    assert sorted(s["doc_id"] for s in got) == list(range(len(DOCS)))
    for s in got:
        theirs = float(s["resps"][0][0][0])
        ours = offline_loglikelihood(shipped_model, s["doc"]["context"], s["doc"]["continuation"])
        assert abs(theirs - ours) < 1e-4, (s["doc"], theirs, ours)
