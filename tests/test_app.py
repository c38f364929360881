"""The Streamlit app, driven headless with AppTest: it opens, plays, steps, scrubs, switches, and refuses bad files.

Engine runs are cached in-process, so only the first test that needs a configuration pays for it.
"""

import json

import pytest
import torch
from streamlit.testing.v1 import AppTest

from app import NOT_IMPLEMENTED, load_uploaded_trace
from minillm.config import EngineConfig
from minillm.engine import Engine
from minillm.request import Request
from minillm.scheduler import ContinuousScheduler
from minillm.trace import Trace
from tests.conftest import random_model


def open_app(**state) -> AppTest:
    at = AppTest.from_file("../app.py", default_timeout=120)
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()


def shown_step(at: AppTest) -> int:
    caption = next(c.value for c in at.caption if c.value.startswith("step "))
    return int(caption.split()[1])


def subheaders(at: AppTest) -> list[str]:
    return [s.value for s in at.subheader]


@pytest.fixture(scope="module", autouse=True)
def keep_torch_threads():
    """The app runs its model on one thread; give the rest of the test session its threads back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_trace() -> Trace:
    engine = Engine(random_model("gqa"), ContinuousScheduler(), EngineConfig(slots=2, block_size=4, max_len=64))
    for i in range(4):
        engine.submit(Request(f"u{i}", [257, 97 + i, 259], 5, arrival_step=i, ignore_eos=True, prompt=f"p{i}"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model's ops are too small to split across threads
    try:
        return engine.run()
    finally:
        torch.set_num_threads(threads)


def test_opens_on_the_seed_story_side_by_side_ready_to_play():
    at = open_app()
    assert not at.exception
    assert subheaders(at) == ["static batching", "continuous batching"]
    assert shown_step(at) == 0
    assert at.button(key="play").label.endswith("play")
    callout = at.success[0].value
    assert "Seats busy" in callout and "Last request finishes" in callout
    assert sum("data:image/png;base64" in m.value for m in at.markdown) == 4  # seats + KV map, each side


def test_step_forward_back_and_scrub():
    at = open_app()
    at.button(key="forward").click().run()
    assert shown_step(at) == 1
    at.button(key="forward").click().run()
    at.button(key="back").click().run()
    assert shown_step(at) == 1
    at.slider(key="step").set_value(300).run()
    assert shown_step(at) == 300
    assert any(">held<" in m.value for m in at.markdown)  # static batching keeps finished users' seats
    at.button(key="restart").click().run()
    assert shown_step(at) == 0 and not at.exception


def test_play_advances_and_pause_stops():
    at = open_app(speed=20)
    at.button(key="play").click().run()
    assert at.session_state.playing and shown_step(at) > 0
    first = shown_step(at)
    at.run()  # what the fragment's timer does: another frame
    assert shown_step(at) > first
    at.button(key="play").click().run()
    paused = shown_step(at)
    at.run()
    assert not at.session_state.playing and shown_step(at) == paused and not at.exception


def test_switching_view_kv_layout_and_scheduler():
    at = open_app()
    at.radio(key="view").set_value("continuous").run()
    assert subheaders(at) == ["continuous batching"]
    at.radio(key="kv").set_value("contiguous").run()
    assert not at.exception and not at.error
    assert any("contiguous, 16 tokens per block" in m.value for m in at.markdown)
    at.radio(key="view").set_value("static").run()
    assert subheaders(at) == ["static batching"] and not at.exception


def test_my_scheduler_stub_says_it_is_not_implemented():
    at = open_app(view="my scheduler")
    assert not at.exception
    assert [i.value for i in at.info] == [NOT_IMPLEMENTED]


def test_switching_workload_shows_its_knobs():
    at = open_app(requests=6, mean_reply=10, view="continuous")
    at.selectbox(key="workload").set_value("chat").run()
    assert not at.exception and not at.error
    assert at.slider(key="requests").value == 6
    assert subheaders(at) == ["continuous batching"]
    assert shown_step(at) == 0


def test_a_malformed_upload_shows_an_error_not_a_traceback(tiny_trace):
    at = open_app()
    at.file_uploader(key="upload").set_value(("bad.json", b"{not json", "application/json")).run()
    assert not at.exception
    assert "not a JSON file" in at.error[0].value
    assert subheaders(at) == ["static batching", "continuous batching"]  # the live runs stay on screen


def test_bad_data_in_session_state_shows_the_validation_message():
    at = open_app(upload_bytes=json.dumps({"format": "minillm-trace", "version": 99}).encode())
    assert not at.exception
    assert "unsupported version 99" in at.error[0].value


def test_a_saved_trace_uploads_and_replays(tiny_trace):
    at = open_app(upload_bytes=json.dumps(tiny_trace.to_dict()).encode())
    assert not at.exception and not at.error
    assert subheaders(at) == ["uploaded: continuous"]
    at.slider(key="step").set_value(len(tiny_trace.steps) - 1).run()
    assert any("finished (length)" in m.value for m in at.markdown)


def test_load_uploaded_trace(tiny_trace):
    assert isinstance(load_uploaded_trace(json.dumps(tiny_trace.to_dict()).encode()), Trace)
    assert load_uploaded_trace(b"\xff\xfe").startswith("not a JSON file")
    data = tiny_trace.to_dict()
    data["steps"][0]["slots"] = [{"id": "nobody", "state": "decode"}, None]
    assert "unknown request 'nobody'" in load_uploaded_trace(json.dumps(data))
    data = tiny_trace.to_dict()
    data["steps"][0]["kv_tables"] = {"u0": [10_000]}  # valid JSON, valid fields, but no such block
    assert load_uploaded_trace(json.dumps(data)).startswith("invalid minillm trace")


def test_my_scheduler_is_loaded_fresh_from_the_exercise_file(tmp_path, monkeypatch):
    import app

    mine = tmp_path / "lesson04_continuous.py"
    mine.write_text("from minillm.scheduler import ContinuousScheduler as MyContinuousScheduler\n")
    monkeypatch.setattr(app, "MY_SCHEDULER_FILE", mine)
    assert isinstance(app.load_my_scheduler(), ContinuousScheduler)
    mine.write_text("x = 1\n")
    with pytest.raises(ImportError):
        app.load_my_scheduler()
    monkeypatch.setattr(app, "MY_SCHEDULER_FILE", tmp_path / "missing.py")
    with pytest.raises(ImportError):
        app.load_my_scheduler()


def test_exports_are_a_trace_file_and_a_png(tiny_trace):
    from app import figure_png
    from viz import plot_occupancy

    assert figure_png(plot_occupancy(tiny_trace))[:4] == b"\x89PNG"
    assert Trace.loads(json.dumps(tiny_trace.to_dict())).steps == tiny_trace.steps
