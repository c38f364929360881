"""The pictures say what the trace says: grid cells, KV blocks, reply text and statuses match the records."""

import numpy as np
import pytest
import torch

from minillm.config import EngineConfig
from minillm.engine import Engine
from minillm.metrics import summarize
from minillm.request import Request
from minillm.scheduler import ContinuousScheduler, StaticScheduler
from minillm.tokenizer import BOS, SEP, decode
from tests.conftest import random_model
from viz import (
    TracePlayer,
    kv_block_fill,
    kv_block_owners,
    kv_blocks_rgb,
    occupancy_grid,
    occupancy_labels,
    plot_kv_blocks,
    plot_occupancy,
    plot_queue,
    plot_utilization,
    request_colors,
    status_at_step,
    text_at_step,
    tokens_produced,
)
from viz.colors import STATE_CODES, STATE_RGB
from viz.raster import LEFT, TOP, OccupancyRaster


def crowd(n=7):
    """Short fixed-length replies (a random model rarely says EOS), arriving over the first steps."""
    return [
        Request(f"q{i}", [BOS, *range(97, 100 + i % 4), SEP], 3 + (i * 5) % 9, arrival_step=i // 2, ignore_eos=True)
        for i in range(n)
    ]


def serve(policy, kv="paged", **cfg):
    engine = Engine(random_model("gqa"), policy, EngineConfig(slots=3, kv=kv, block_size=4, max_len=64, **cfg))
    for request in crowd():
        engine.submit(request)
    return engine.run()


@pytest.fixture(scope="module")
def traces():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model's ops are too small to split: threads only add waiting (and contention)
    try:
        return {
            "static": serve(StaticScheduler()),
            "continuous": serve(ContinuousScheduler()),
            "contiguous": serve(ContinuousScheduler(), kv="contiguous"),
            "preempting": serve(ContinuousScheduler(), num_blocks=7),  # too small a pool for three growing replies
        }
    finally:
        torch.set_num_threads(threads)


ALL = ["static", "continuous", "contiguous", "preempting"]


@pytest.mark.parametrize("name", ALL)
def test_grid_codes_and_labels_equal_the_slot_states(traces, name):
    trace = traces[name]
    grid, labels = occupancy_grid(trace), occupancy_labels(trace)
    assert grid.shape == labels.shape == (3, len(trace.steps))
    for t, step in enumerate(trace.steps):
        for seat, slot in enumerate(step.slots):
            assert grid[seat, t] == (STATE_CODES[slot["state"]] if slot else 0)
            assert labels[seat, t] == (slot["id"] if slot else "")
    assert occupancy_grid(trace, upto=4).shape == (3, 5)
    assert (occupancy_grid(trace, upto=4) == grid[:, :5]).all()


def test_static_holds_seats_and_continuous_never_does(traces):
    assert (occupancy_grid(traces["static"]) == 3).any()
    assert not (occupancy_grid(traces["continuous"]) == 3).any()


def test_the_preempting_run_really_preempts(traces):
    assert any(step.preempted for step in traces["preempting"].steps)


@pytest.mark.parametrize("name", ALL)
def test_block_owners_and_fill_equal_the_kv_tables(traces, name):
    trace, size = traces[name], traces[name].config["block_size"]
    for t, step in enumerate(trace.steps):
        owners, fill = kv_block_owners(trace, t), kv_block_fill(trace, t)
        assert len(owners) == len(fill) == step.kv_blocks_total
        assert sum(o is not None for o in owners) == step.kv_blocks_used
        for rid, blocks in step.kv_tables.items():
            assert all(owners[b] == rid for b in blocks)
            assert round(sum(fill[b] for b in blocks) * size) == step.kv_tokens[rid]
        assert all(f == 0 for o, f in zip(owners, fill) if o is None)


def test_contiguous_shows_reserved_but_empty_blocks_and_paged_does_not_waste_whole_blocks(traces):
    def empty_owned(trace):
        return sum(
            o is not None and f == 0
            for t in range(len(trace.steps))
            for o, f in zip(kv_block_owners(trace, t), kv_block_fill(trace, t))
        )

    assert empty_owned(traces["contiguous"]) > 0
    assert empty_owned(traces["continuous"]) == 0  # a paged sequence holds only the blocks it fills


@pytest.mark.parametrize("name", ALL)
def test_text_grows_by_one_token_per_working_step(traces, name):
    trace = traces[name]
    for r in trace.requests:
        produced = [tokens_produced(trace, r.id, t) for t in range(len(trace.steps))]
        for t, step in enumerate(trace.steps):
            working = any(s and s["id"] == r.id and s["state"] != "held" for s in step.slots)
            assert produced[t] - (produced[t - 1] if t else 0) == int(working)
            assert text_at_step(trace, r.id, t) == decode(r.output_ids[: produced[t]])
        assert produced[-1] == len(r.output_ids) == r.max_new_tokens  # nothing lost, even when preempted
        assert text_at_step(trace, r.id, len(trace.steps) - 1) == decode(r.output_ids)


def test_statuses_follow_a_request_through_its_life(traces):
    static = traces["static"]
    late = next(r for r in static.requests if r.arrival_step > 0)
    assert status_at_step(static, late.id, late.arrival_step - 1) == "not arrived"
    assert status_at_step(static, late.id, late.admit_step) == "running"
    short = min(static.requests, key=lambda r: r.finish_step)
    assert status_at_step(static, short.id, short.finish_step) == "finished (length)"
    assert status_at_step(static, short.id, short.finish_step + 1) == "held"  # static keeps its seat
    queued = next(r for r in static.requests if r.admit_step > r.arrival_step)
    assert status_at_step(static, queued.id, queued.arrival_step) == "waiting"
    cont = traces["continuous"]
    assert all(status_at_step(cont, r.id, len(cont.steps) - 1) == "finished (length)" for r in cont.requests)
    pre = traces["preempting"]
    t, victim = next((t, s.preempted[0]) for t, s in enumerate(pre.steps) if s.preempted)
    assert status_at_step(pre, victim, t) == "preempted"


def test_plot_occupancy_draws_the_grid_up_to_the_current_step(traces):
    trace = traces["static"]
    fig = plot_occupancy(trace, upto=5)
    image = np.asarray(fig.axes[0].images[0].get_array())
    assert image.shape == (3, len(trace.steps), 3)
    assert (image[:, :6] == STATE_RGB[occupancy_grid(trace, upto=5)]).all()
    assert (image[:, 6:] == 255).all()  # not played yet: blank
    assert fig.axes[0].lines[0].get_xdata()[0] == pytest.approx(5.5)  # the "now" line
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert texts and texts <= {r.id for r in trace.requests} | {f"{r.id} done, seat held" for r in trace.requests}


def test_kv_picture_and_figures(traces):
    trace = traces["contiguous"]
    image = kv_blocks_rgb(trace, 3, cell=8)
    assert image.dtype == np.uint8 and image.shape[2] == 3
    assert plot_kv_blocks(trace, 3).axes[0].images
    for name in ("static", "continuous"):
        util = plot_utilization(traces[name]).axes[0].lines[0].get_ydata()
        assert util[-1] == pytest.approx(summarize(traces[name])["slot_utilization"])
        queue = plot_queue(traces[name]).axes[0].lines[0].get_ydata()
        assert list(queue) == [len(s.waiting) for s in traces[name].steps]


def test_a_request_keeps_its_colour_across_runs(traces):
    colors = request_colors(traces["static"])
    assert colors == request_colors(traces["continuous"])
    assert len(set(colors.values())) == len(colors)


def test_raster_pixels_and_frames_match_the_trace(traces):
    trace = traces["static"]
    raster = OccupancyRaster(trace, width=600)
    picture = np.asarray(raster.frame(len(trace.steps) - 1))
    grid = occupancy_grid(trace)
    for seat in range(3):
        for t in range(len(trace.steps)):
            x = LEFT + (raster.px_of_step[t] + raster.px_of_step[t + 1]) // 2
            y = TOP + seat * raster.row_h + 1  # the top edge of the cell, clear of the label
            if raster.px_of_step[t + 1] - raster.px_of_step[t] > 2:
                assert tuple(picture[y, x]) == tuple(STATE_RGB[grid[seat, t]])
    player = TracePlayer(trace, width=600)
    frame = player.frame(4)
    assert frame.occupancy_png[:4] == b"\x89PNG" and frame.kv_png[:4] == b"\x89PNG"
    assert frame.metrics == summarize(trace, upto=4)
    assert frame.waiting == trace.steps[4].waiting
    assert {r.id: r.text for r in frame.replies} == {r.id: text_at_step(trace, r.id, 4) for r in frame.replies}
    assert player.frame(10_000).step == len(trace.steps) - 1
