"""serve --api-key (or MINILLM_API_KEY): /v1/* and /trace need `Authorization: Bearer KEY`, else a 401 with OpenAI's
error object, before anything reaches the engine; /health and /metrics stay open (as vLLM's); no key: as before.
The openai client works with the key and gets an AuthenticationError without it; `load` sends it; the key is never
printed, alone or with replicas behind the router. Every server here stops, even when a test fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import openai
import pytest

from minillm.__main__ import main
from minillm.bench.server import answering, free_port
from minillm.serving.api_key import api_key_from
from minillm.serving.server import ServerThread, build_loop

KEY = "room-key-7f3a9c"  # (a test's key: a real one comes from `secrets.token_urlsafe()`)
BEARER = {"Authorization": f"Bearer {KEY}"}
CHAT = {"messages": [{"role": "user", "content": "count down from 3"}], "max_tokens": 8}
COMPLETION = {"prompt": "count down from 3", "max_tokens": 8}
GUARDED = [("POST", "/v1/chat/completions", CHAT), ("POST", "/v1/completions", COMPLETION),
           ("GET", "/v1/models", None), ("GET", "/v1/models/minillm", None), ("GET", "/trace", None)]  # fmt: skip
WRONG = [{}, {"Authorization": "Bearer not-the-key"}, {"Authorization": f"Bearer {KEY[:-1]}"},
         {"Authorization": f"Basic {KEY}"}, {"Authorization": KEY}, {"Authorization": "Bearer"}]  # fmt: skip


class Counted:
    """The app's engine, with the requests handed to it counted."""

    def __init__(self, loop):
        self.submitted, self.submit_to = 0, loop.submit
        loop.submit = self.submit

    def submit(self, request, stream, service=None, follows=None) -> None:  # (LoopHandle.submit's arguments)
        self.submitted += 1
        self.submit_to(request, stream, service, follows)


@pytest.fixture(scope="module")
def keyed(shipped_model):
    loop = build_loop(shipped_model, slots=2)
    counted = Counted(loop)
    with ServerThread(loop, api_key=KEY, max_body_bytes=10_000) as running:
        running.counted = counted
        yield running


@pytest.fixture(scope="module")
def open_server(shipped_model):
    with ServerThread(build_loop(shipped_model, slots=2)) as running:
        yield running


def test_the_key_comes_from_the_flag_then_the_environment(monkeypatch):
    monkeypatch.delenv("MINILLM_API_KEY", raising=False)
    assert api_key_from(None) is None and api_key_from("") is None and api_key_from("a") == "a"
    monkeypatch.setenv("MINILLM_API_KEY", "b")
    assert api_key_from(None) == "b" and api_key_from("a") == "a"
    monkeypatch.setenv("MINILLM_API_KEY", "")
    assert api_key_from(None) is None


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer anything"}])
def test_without_a_key_configured_everything_answers_as_before(open_server, headers):
    with httpx.Client(base_url=open_server.base, timeout=60, headers=headers) as client:
        for method, path, body in GUARDED + [("GET", "/health", None), ("GET", "/metrics", None)]:
            assert client.request(method, path, json=body).status_code == 200, path


@pytest.mark.parametrize("headers", WRONG, ids=["none", "wrong", "one-short", "basic", "no-scheme", "empty"])
@pytest.mark.parametrize("method, path, body", GUARDED, ids=[p for _, p, _ in GUARDED])
def test_a_missing_or_wrong_key_gets_openais_401_and_the_engine_never_sees_it(keyed, method, path, body, headers):
    before = keyed.counted.submitted
    response = httpx.request(method, keyed.base + path, json=body, headers=headers, timeout=60)
    assert response.status_code == 401 and response.headers["www-authenticate"].startswith("Bearer")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] is None
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert "Authorization: Bearer" in error["message"] and KEY[:6] not in response.text
    assert keyed.counted.submitted == before


def test_the_key_is_checked_before_the_body_is_read(keyed):
    """A body over --max-body-bytes: 401 without the key (nobody reads it), 413 with it."""
    big = {"prompt": "x" * 20_000}
    assert httpx.post(f"{keyed.url}/completions", json=big, timeout=60).status_code == 401
    assert httpx.post(f"{keyed.url}/completions", json=big, headers=BEARER, timeout=60).status_code == 413


def test_health_and_metrics_stay_open_as_vllms_do(keyed):
    assert httpx.get(f"{keyed.base}/health", timeout=60).json()["status"] == "ok"
    assert httpx.get(f"{keyed.base}/metrics", timeout=60).status_code == 200


@pytest.mark.parametrize("scheme", ["Bearer", "bearer"])
def test_the_right_key_is_served_whole_and_streamed(keyed, scheme):
    headers = {"Authorization": f"{scheme} {KEY}"}
    with httpx.Client(base_url=keyed.url, headers=headers, timeout=60) as client:
        chat = client.post("/chat/completions", json=CHAT)
        assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"]
        completion = client.post("/completions", json=COMPLETION)
        assert completion.status_code == 200 and completion.json()["choices"][0]["text"]
        with client.stream("POST", "/chat/completions", json=CHAT | {"stream": True}) as stream:
            assert stream.status_code == 200
            lines = [line for line in stream.iter_lines() if line.startswith("data:")]
        assert lines[-1] == "data: [DONE]" and "chat.completion.chunk" in lines[0]
        assert client.get(f"{keyed.base}/trace", params={"last_steps": 5}).status_code == 200


def test_the_openai_client_with_the_key_and_without(keyed):
    with openai.OpenAI(base_url=keyed.url, api_key=KEY, max_retries=0, timeout=60) as client:
        reply = client.chat.completions.create(model="minillm", messages=CHAT["messages"], max_tokens=8)
        assert reply.choices[0].message.content
        chunks = client.completions.create(model="minillm", prompt="count down from 3", max_tokens=8, stream=True)
        pieces = [chunk.choices[0].text for chunk in chunks if chunk.choices]
        assert "".join(pieces)
    before = keyed.counted.submitted
    with openai.OpenAI(base_url=keyed.url, api_key="not-the-key", max_retries=0, timeout=60) as client:
        with pytest.raises(openai.AuthenticationError) as refused:
            client.chat.completions.create(model="minillm", messages=CHAT["messages"])
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    assert keyed.counted.submitted == before


def test_load_sends_the_key_from_the_flag_or_the_environment(keyed, capsys, monkeypatch):
    monkeypatch.delenv("MINILLM_API_KEY", raising=False)
    flags = ["load", "--url", keyed.url, "--requests", "3", "--json", "--ttft-target-s", "30"]
    assert main([*flags, "--api-key", KEY]) == 0
    assert json.loads(capsys.readouterr().out)["finished"] == 3
    monkeypatch.setenv("MINILLM_API_KEY", KEY)
    assert main(flags) == 0
    assert json.loads(capsys.readouterr().out)["finished"] == 3
    monkeypatch.delenv("MINILLM_API_KEY")
    assert main(flags) == 2
    err = capsys.readouterr().err
    assert "asks for an API key (401)" in err and err.count("\n") == 1
    assert main([*flags, "--model", "minillm"]) == 2  # (no model list asked first: each request gets the 401)
    err = capsys.readouterr().err
    assert "invalid_api_key" in err and KEY not in err


# The key from the flag to one engine, and from the environment to the router over replicas (engine processes behind
# the router's app, as --disaggregate's and --tp's are: each took 10-13 s here and reads the key the same way)
SERVE_MODES = [(["--api-key", KEY], {}), (["--replicas", "2", "--slots", "2"], {"MINILLM_API_KEY": KEY})]


@pytest.mark.parametrize("flags, env", SERVE_MODES, ids=["flag", "replicas-env"])
def test_serve_from_the_command_line_never_prints_the_key(flags, env):
    """The real command in every mode (the key from the flag or the environment). One app checks it: with --replicas
    the router's; the replicas behind it (and --disaggregate's and --tp's processes) are engine processes on pipes
    and torch.distributed, with no HTTP of their own to guard, so none of them is given the key."""
    port = free_port()
    command = [sys.executable, "-m", "minillm", "serve", "--port", str(port), *flags]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True, env=os.environ | {"PYTHONUNBUFFERED": "1"} | env)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        answering(server, f"{base}/health", 120, "the server")
        assert httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=60).status_code == 401
        assert httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=60,
                          headers={"Authorization": "Bearer wrong"}).status_code == 401  # fmt: skip
        with openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=60) as client:
            reply = client.chat.completions.create(model="minillm", messages=CHAT["messages"])
        assert reply.choices[0].message.content == "3 2 1"
        server.send_signal(signal.SIGTERM)
        code = server.wait(30)
    finally:
        if server.poll() is None:  # (a failed check above: the whole group, the engine processes too)
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(30)
    out, err = server.stdout.read(), server.stderr.read()
    assert code == 0 and "a key is required" in out and "Authorization: Bearer $MINILLM_API_KEY" in out
    assert KEY not in out and KEY not in err and "Traceback" not in err


def test_the_live_view_sends_the_key_to_trace(keyed):
    from viz.app.live import LiveFeed, ServerError

    httpx.post(f"{keyed.url}/completions", json=COMPLETION, headers=BEARER, timeout=60)  # (a step to watch)
    blind, watching = LiveFeed(keyed.base), LiveFeed(keyed.base, KEY)
    try:
        with pytest.raises(ServerError, match="API key"):
            blind.poll()
        assert watching.poll() > 0 and watching.player is not None
    finally:
        blind.close()
        watching.close()
