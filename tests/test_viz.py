"""The pictures say what the trace says: grid cells, KV blocks, token bars, figures so far, reply text and
statuses match the records; the card's pictures match the roofline."""

from html import escape

import numpy as np
import pytest
import torch

from minillm.card import roofline, whatif
from minillm.card.hardware import get_device
from minillm.card.modelspec import load_spec
from minillm.card.simulate import SimulatedRunner
from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler, StaticScheduler
from minillm.layers import LayeredEngine
from minillm.model.tokenizer import BOS, SEP, decode
from minillm.runs.metrics import summarize, utilization_now
from minillm.runs.run import run_workload
from minillm.runs.workload import ChatKnobs
from tests.conftest import one_torch_thread, random_model
from viz import (
    RunProgress,
    Timeline,
    TokenSplit,
    TracePlayer,
    kv_block_fill,
    kv_block_owners,
    kv_block_refs,
    kv_blocks_rgb,
    kv_memory,
    memory_split,
    occupancy,
    occupancy_grid,
    occupancy_labels,
    plot_kv_blocks,
    plot_memory_split,
    plot_occupancy,
    plot_queue,
    plot_speed_by_batch,
    plot_users_by_context,
    plot_utilization,
    request_colors,
    speed_by_batch,
    status_at_step,
    text_at_step,
    token_split,
    token_splits,
    tokens_produced,
    users_by_context,
)
from viz.card import smallest_text_pt
from viz.colors import (
    CACHED_FREE_BLOCK,
    DECODE,
    EMPTY,
    FREE_BLOCK,
    HELD,
    PREFILL,
    REQUEST_PALETTE,
    STALLED,
    STATE_CODES,
    STATE_COLORS,
    STATE_RGB,
    rgb255,
    text_on,
)
from viz.events import StepEvents, describe, step_events
from viz.html import (
    FIGURE_VALUE_EM,
    chip,
    event_html,
    figure_min_em,
    figures_html,
    headline_html,
    queue_html,
    replies_html,
    text_em,
    token_budget_html,
)
from viz.live_window import live_player
from viz.occupancy import seat_runs
from viz.raster import TOP, OccupancyRaster, font


def crowd(n=7):
    """Short fixed-length replies (a random model rarely says EOS), arriving over the first steps."""
    return [
        Request(f"q{i}", [BOS, *range(97, 100 + i % 4), SEP], 3 + (i * 5) % 9, arrival_step=i // 2, ignore_eos=True)
        for i in range(n)
    ]


def sharers(n=5):
    """Prompts that start with the same 9 tokens (two full blocks of 4), arriving one step apart."""
    return [
        Request(f"s{i}", [BOS, *range(97, 105), 110 + i, SEP], 4 + i, arrival_step=i, ignore_eos=True) for i in range(n)
    ]


def serve(policy, kv="paged", requests=None, **cfg):
    engine = LayeredEngine(random_model("gqa"), policy, EngineConfig(slots=3, kv=kv, block_size=4, max_len=64, **cfg))
    for request in requests or crowd():
        engine.submit(request)
    return engine.run()


@pytest.fixture(scope="module")
def traces():
    with one_torch_thread():  # a tiny model's ops are too small to split: threads only add waiting (and contention)
        return {
            "static": serve(StaticScheduler()),
            "continuous": serve(ContinuousScheduler()),
            "contiguous": serve(ContinuousScheduler(), kv="contiguous"),
            "preempting": serve(ContinuousScheduler(), num_blocks=7),  # too small a pool for three growing replies
            "budgeted": serve(ContinuousScheduler(token_budget=4)),  # prompts of 5-8 tokens: cut into chunks
            "shared": serve(ContinuousScheduler(), requests=sharers(), num_blocks=24, prefix_caching=True),
        }


ALL = ["static", "continuous", "contiguous", "preempting", "budgeted", "shared"]


@pytest.fixture(scope="module")
def simulated():
    """A small crowd on a simulated card: times in simulated seconds, no block tables recorded."""
    card = lambda: SimulatedRunner(load_spec("llama-3.1-8b"), get_device("rtx-4090"))
    knobs = ChatKnobs(requests=24, rate_per_s=4)
    return {s: run_workload(card(), "azure-conv", s, knobs=knobs, slots=8) for s in ("static", "continuous")}


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
        owners, fill, refs = kv_block_owners(trace, t), kv_block_fill(trace, t), kv_block_refs(trace, t)
        assert len(owners) == len(fill) == len(refs) == step.kv_blocks_total
        assert sum(o is not None for o in owners) == step.kv_blocks_used
        for rid, blocks in step.kv_tables.items():
            assert all(owners[b] == rid or refs[b] > 1 for b in blocks)  # a shared block shows one of its holders
            assert round(sum(fill[b] for b in blocks) * size) == step.kv_tokens[rid]
        assert refs.sum() == sum(len(blocks) for blocks in step.kv_tables.values())
        assert all(f == 0 for o, f in zip(owners, fill) if o is None)
        memory = kv_memory(step, size)
        assert memory["stored"] + memory["reserved"] + memory["cached"] + memory["free"] == step.kv_blocks_total


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
def test_text_grows_by_one_token_per_decode_step_and_finished_prompt(traces, name):
    trace = traces[name]
    for r in trace.requests:
        produced = [tokens_produced(trace, r.id, t) for t in range(len(trace.steps))]
        for t, step in enumerate(trace.steps):
            seat = next((s for s in step.slots if s and s["id"] == r.id), None)
            state = seat["state"] if seat else None
            made = produced[t] - (produced[t - 1] if t else 0)
            assert made == (seat["produced"] if seat else 0)
            assert made == 1 if state == "decode" else made <= (state == "prefill")  # a prompt's last chunk makes one
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
            x = raster.left + (raster.left_px[t] + raster.right_px[t]) // 2
            y = TOP + seat * raster.row_h + 1  # the top edge of the cell, clear of the label
            if raster.right_px[t] - raster.left_px[t] > 2:
                assert tuple(picture[y, x]) == tuple(STATE_RGB[grid[seat, t]])
    player = TracePlayer(trace, width=600)
    frame = player.frame(4)
    assert frame.occupancy_png[:4] == b"\x89PNG" and frame.kv_png[:4] == b"\x89PNG"
    assert frame.metrics == RunProgress(trace).at(4)
    assert frame.waiting == trace.steps[4].waiting
    assert {r.id: r.text for r in frame.replies} == {r.id: text_at_step(trace, r.id, 4) for r in frame.replies}
    assert player.frame(10_000).step == len(trace.steps) - 1


def test_seat_runs_equal_a_plain_loop(traces):
    def plain(grid, labels):  # one run per (occupant, held or not) stretch, empty seats skipped
        runs = []
        for seat in range(grid.shape[0]):
            start = 0
            for t in range(1, grid.shape[1] + 1):
                key = (labels[seat, start], grid[seat, start] == HELD)
                if t == grid.shape[1] or (labels[seat, t], grid[seat, t] == HELD) != key:
                    if labels[seat, start]:
                        runs.append((seat, start, t - 1, labels[seat, start], bool(key[1])))
                    start = t
        return runs

    for name in ALL:
        grid, labels = occupancy_grid(traces[name]), occupancy_labels(traces[name])
        assert seat_runs(grid, labels) == plain(grid, labels)


@pytest.mark.parametrize("name", ALL)
def test_figures_so_far_match_metrics_and_count_the_waiting(traces, name):
    trace = traces[name]
    progress = RunProgress(trace)
    for t in range(len(trace.steps)):
        m, upto = progress.at(t), summarize(trace, upto=t)
        assert m["utilization_now"] == pytest.approx(utilization_now(trace, t))
        assert m["utilization_so_far"] == pytest.approx(upto["slot_utilization"])
        assert m["queue_length"] == upto["queue_length"] and m["tokens_so_far"] == upto["output_tokens"]
        # TTFT so far: a request with no first token yet counts its steps waited so far
        ttft = [
            (r.first_token_step if r.first_token_step is not None and r.first_token_step <= t else t)
            - r.arrival_step
            + 1
            for r in trace.requests
            if r.arrival_step <= t
        ]
        assert m["ttft_p50_steps"] == pytest.approx(np.median(ttft))
        assert m["waiting_for_first_token"] == sum(
            r.arrival_step <= t and (r.first_token_step is None or r.first_token_step > t) for r in trace.requests
        )
    end = summarize(trace)
    assert progress.at(len(trace.steps) - 1)["ttft_p50_steps"] == pytest.approx(end["ttft_p50_steps"])
    assert progress.at(len(trace.steps) - 1)["tpot_p50_s"] == pytest.approx(end["tpot_p50_s"])


def test_waiting_requests_raise_static_ttft_so_far(traces):
    trace = traces["static"]
    progress = RunProgress(trace)
    t = max(r.first_token_step for r in trace.requests) - 1  # the last admitted request is still waiting here
    m = progress.at(t)
    assert m["waiting_for_first_token"] >= 1
    assert m["ttft_p50_steps"] >= m["ttft_p50_steps_started_only"]  # the waiting ones waited longer than the first


@pytest.mark.parametrize("name", ALL)
def test_token_splits_match_the_seats(traces, name):
    trace = traces[name]
    splits = token_splits(trace)
    for t, step in enumerate(trace.steps):
        decode_rows = sum(s["tokens"] for s in step.slots if s and s["state"] == "decode")
        prefill = sum(s["tokens"] for s in step.slots if s and s["state"] == "prefill")
        assert list(splits[t]) == [decode_rows, prefill, step.padding_rows]
        assert token_split(step) == TokenSplit(*splits[t])
        assert prefill == step.prefill_tokens


def test_a_small_budget_cuts_prompts_into_chunks(traces):
    trace = traces["budgeted"]
    splits = token_splits(trace)
    assert (splits[:, 0] + splits[:, 1] <= 4).all()  # never over the budget
    chunks = {}
    for step in trace.steps:
        for _, rid, state, ran, _ in step.seats:
            if state == "prefill":
                chunks.setdefault(rid, []).append(ran)
    assert any(len(c) > 1 for c in chunks.values())  # some prompt took several steps
    assert ((splits[:, 0] > 0) & (splits[:, 1] > 0)).any()  # decode rows and a chunk in one step
    assert (token_splits(traces["static"])[:, 2] > 0).any()  # static computes its held seats as padding


def test_shared_blocks_are_framed_and_cached_free_blocks_drawn_green(traces):
    trace, cell = traces["shared"], 12
    cols = 16  # blocks_per_row: 64 tokens / 4 per block
    shared_steps = [t for t in range(len(trace.steps)) if (kv_block_refs(trace, t) > 1).any()]
    assert shared_steps, "no step shares a block: the prefix cache did not hit"
    t = shared_steps[0]
    image, refs = kv_blocks_rgb(trace, t, cell=cell), kv_block_refs(trace, t)
    corner = lambda b: tuple(image[(b // cols) * cell, (b % cols) * cell])
    for block in np.nonzero(refs > 1)[0]:
        assert corner(block) == (0, 0, 0)
    for block in np.nonzero(refs == 1)[0]:
        assert corner(block) != (0, 0, 0)
    cached_steps = [t for t, s in enumerate(trace.steps) if s.kv_cached_free]
    assert cached_steps, "no free block kept a cached prefix"
    t = cached_steps[-1]
    image, block = kv_blocks_rgb(trace, t, cell=cell), trace.steps[t].kv_cached_free[0]
    middle = tuple(image[(block // cols) * cell + cell // 2, (block % cols) * cell + cell // 2])
    assert middle == tuple(rgb255(CACHED_FREE_BLOCK))


def test_tiny_runs_advance_by_steps_together(traces):
    players = [TracePlayer(traces[n], 600) for n in ("static", "continuous")]
    timeline = Timeline.of(players)
    assert timeline.unit == "step" and timeline.last == max(p.last_step for p in players)
    short = min(players, key=lambda p: p.last_step)
    assert timeline.step_of(short, timeline.last) == short.last_step  # a finished run stays on its last step


def test_simulated_runs_advance_by_time_on_one_clock(simulated):
    end = max(t.steps[-1].time_s for t in simulated.values())
    players = [TracePlayer(t, 700, axis_seconds=end) for t in simulated.values()]
    timeline = Timeline.of(players)
    assert timeline.unit == "s" and timeline.seconds(timeline.last) >= end
    for player in players:
        starts = player.progress.start_s
        for position in range(0, timeline.last + 1, max(1, timeline.last // 40)):
            t, step = timeline.seconds(position), timeline.step_of(player, position)
            assert starts[step] <= t or step == 0
            assert step == player.last_step or starts[step + 1] > t
        frame = player.frame(player.last_step // 2)
        assert frame.kv_png is None and frame.replies == []  # no tables recorded; replies are placeholders
        assert frame.kv["total"] == player.trace.config["num_blocks"]
        assert frame.occupancy_png[:4] == b"\x89PNG"


def test_a_time_axis_leaves_idle_gaps_empty():
    runner = SimulatedRunner(load_spec("llama-3.1-8b"), get_device("rtx-4090"))
    trace = run_workload(runner, "azure-conv", "continuous", knobs=ChatKnobs(requests=6, rate_per_s=0.2), slots=8)
    raster = OccupancyRaster(trace, 700, axis_seconds=trace.steps[-1].time_s)
    picture = np.asarray(raster.frame(len(trace.steps) - 1))
    starts = [s.time_s - s.wall_s for s in trace.steps]
    gaps = [
        (trace.steps[i].time_s, starts[i + 1])
        for i in range(len(starts) - 1)
        if starts[i + 1] - trace.steps[i].time_s > 0.5
    ]
    assert gaps, "this crowd never left the engine idle"
    scale = raster.plot_w / raster.axis
    a, b = gaps[0]
    x = raster.left + int((a + b) / 2 * scale)
    rows = TOP + np.arange(raster.slots) * raster.row_h + 1  # a pixel inside each seat's row
    assert (picture[rows, x] == STATE_RGB[0]).all()  # nobody seated while the engine waits


def test_card_pictures_follow_the_roofline():
    spec, card = load_spec("llama-3.1-8b"), get_device("rtx-4090")
    plan = whatif.plan(spec, card, context=4096)
    parts = dict(memory_split(plan))
    assert sum(parts.values()) == pytest.approx(plan["memory_bytes"])
    assert min(parts.values()) >= 0 and parts["KV cache"] + parts["KV room left"] == pytest.approx(
        plan["free_kv_bytes"]
    )
    assert parts["KV room left"] < 4096 * plan["kv_bytes_per_token"]  # less than one more user's worth
    big = whatif.plan(load_spec("llama-3.1-70b"), card)
    assert sum(v for _, v in memory_split(big)) > big["memory_bytes"]  # the weights alone overflow the card
    contexts = [256, 1024, 4096, 16384]
    users = users_by_context(spec, card, contexts)
    assert list(users) == [roofline.max_users(spec, card, c) for c in contexts]
    assert (np.diff(users) <= 0).all() and users[0] >= 4 * users[2]
    speed = speed_by_batch(spec, card, 512, [1, 2, 8, 64, 512, 1024])
    assert (np.diff(speed["total"]) > 0).all() and (np.diff(speed["per_user"]) <= 0).all()
    ridge = roofline.ridge_batch(spec, card, 512)
    assert list(speed["compute_bound"]) == [b > ridge for b in speed["batch"]]
    for figure in (
        plot_memory_split(plan),
        plot_users_by_context(spec, card, 4096),
        plot_speed_by_batch(spec, card, 512),
        plot_memory_split(big),
        plot_users_by_context(load_spec("llama-3.1-70b"), card, 4096),  # not one user fits: still a picture
    ):
        assert figure.axes


def test_the_roofline_picture_puts_decode_steps_under_the_roof():
    from viz.roofline import decode_dots, plot_roofline, roof

    spec, card = load_spec("llama-3.1-8b"), get_device("rtx-4090")
    ridge = roofline.ridge_intensity(card)  # 165.2 TFLOP/s / 1008 GB/s = 164 FLOPs per byte
    assert roof(card, [1, ridge, 10 * ridge]) == pytest.approx([1008e9, 165.2e12, 165.2e12])
    dots = decode_dots(spec, card, 128, [1, 4, 16, 64, 256, 1024])
    assert (np.diff(dots["intensity"]) > 0).all() and dots["intensity"][0] == pytest.approx(1, rel=0.05)  # ~ batch
    assert (dots["flops_per_s"] < roof(card, dots["intensity"])).all()  # the cost model never beats the roof
    assert list(dots["fits"]) == [True] * 5 + [False]  # 404 users fit at 128 tokens each
    figure = plot_roofline(spec, card)
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert "12 users: KV full" in texts and "1" in texts and "1024" not in texts  # no dot for users that do not fit


def test_budget_bar_and_figures_html():
    over = token_budget_html(TokenSplit(decode=3, prefill=4, padding=2), budget=7, scale=9, made=4)
    assert "7 of a 7-token budget, and 2 padding rows" in over and "border-left" in over  # the budget marked
    assert "; 4 new tokens came out" in over  # beside the figure "new tokens": computed and made, both said
    assert "3 decode" in over and "4 prefill" in over and "2 padding" in over
    assert "no token budget" in token_budget_html(TokenSplit(1, 0, 0), budget=None, scale=5)
    html = figures_html([("TTFT p50, steps", "151", "4 still waiting", "tip")])
    assert 'data-figure="TTFT p50, steps">151<' in html and "4 still waiting" in html


@pytest.fixture(scope="module")
def many_seats():
    """A simulated static run on 40 seats: too many for a row each."""
    runner = SimulatedRunner(load_spec("qwen3-0.6b"), get_device("h100-sxm"))
    return run_workload(runner, "azure-conv", "static", knobs=ChatKnobs(requests=90, rate_per_s=1000), slots=40)


def test_more_than_24_seats_are_drawn_stacked_by_state(many_seats):
    """Each step's column keeps its count of seats in each state; working seats sit at the bottom, then stalled,
    held, empty: the height of the blue is the busy seats. No per-seat names (a row would be a few pixels high)."""
    grid = occupancy_grid(many_seats)
    stacked = occupancy.stacked(grid)
    assert grid.shape[0] > occupancy.SEAT_ROWS and stacked.shape == grid.shape
    for t in range(grid.shape[1]):
        assert sorted(stacked[:, t]) == sorted(grid[:, t])
        rank = occupancy.STACK_ORDER[stacked[:, t]]
        assert list(rank) == sorted(rank, reverse=True)  # bottom row: the lowest rank (working)
    busy = (grid == DECODE) | (grid == PREFILL)
    assert any(0 < busy[:, t].sum() < grid.shape[0] for t in range(grid.shape[1]))
    raster = OccupancyRaster(many_seats, width=700, axis_seconds=many_seats.steps[-1].time_s, text_px=20)
    assert raster.stacked and not raster.runs  # no names
    picture = np.asarray(raster.frame(len(many_seats.steps) - 1))
    t = int(np.argmax(busy.sum(axis=0)))  # the busiest step: its column's bottom pixel is a working seat's colour
    x = raster.left + (raster.left_px[t] + raster.right_px[t]) // 2
    assert tuple(picture[raster.plot_bottom - 1, x]) in {tuple(STATE_RGB[DECODE]), tuple(STATE_RGB[PREFILL])}
    figure = plot_occupancy(many_seats)
    assert figure.axes[0].get_ylabel().startswith("seats, by state") and not figure.axes[0].texts


def test_chart_lettering_grows_with_text_px(traces):
    small, large = OccupancyRaster(traces["static"], 700), OccupancyRaster(traces["static"], 700, text_px=24)
    assert large.left > small.left and large.bottom > small.bottom  # room for the larger names and ticks
    assert large.frame(3).size[1] > small.frame(3).size[1]


def test_the_chat_window_reads_like_a_chat(traces):
    frame = TracePlayer(traces["static"], 600).frame(len(traces["static"].steps) - 1)
    chat = replies_html(frame.replies)
    for reply in frame.replies:
        assert f'data-request="{reply.id}"' in chat and escape(reply.prompt) in chat
    assert "done" in chat and "finished (length)" in chat  # the words, and the engine's status in the tooltip


def test_a_speculative_step_draws_kept_and_rejected_guesses():
    """With speculation a decode row makes several tokens in a step: the replies grow by them, and the step's
    guesses are drawn on the reply's end (kept, the model's own token, rejected) as the trace recorded them."""
    model = random_model("gqa")
    noisy = random_model("gqa")
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.5 * p.std())
    engine = LayeredEngine(model, ContinuousScheduler(), EngineConfig(slots=2, max_len=256, speculate=3), draft=noisy)
    for i in range(2):
        engine.submit(Request(f"s{i}", [BOS, 40 + i, 41, SEP], 20, ignore_eos=True))
    trace = engine.run()
    player = TracePlayer(trace, 600)
    drawn = kept_and_rejected = 0
    for step, record in enumerate(trace.steps):
        frame = player.frame(step)
        for reply in frame.replies:
            assert reply.text == text_at_step(trace, reply.id, step)
            if reply.id not in record.drafts:
                assert reply.guesses is None
                continue
            draft, n = record.drafts[reply.id], record.accepted[reply.id]
            kept, own, rejected = reply.guesses
            assert (kept, rejected) == (decode(draft[:n]), decode(draft[n:])) and reply.text.endswith(kept + own)
            chat = replies_html([reply])
            assert "data-kept" in chat and "guesses it rejected" in chat
            drawn += 1
            kept_and_rejected += bool(n and draft[n:])
    assert drawn and kept_and_rejected, "the run meant to show steps with guesses kept and rejected"
    assert max(entry[4] for s in trace.steps for entry in s.seats) > 1  # several tokens in one step


# --- what happened in a step, in words (events.py) ------------------------------------------------------------------
def events_by_loop(trace, step: int) -> dict:
    """step_events by a plain loop over the seats: who left which seat, who came, who became held."""
    now = {slot_no: slot for slot_no, slot in enumerate(trace.steps[step].slots) if slot}
    before = {slot_no: slot for slot_no, slot in enumerate(trace.steps[step - 1].slots) if slot} if step else {}
    return {
        "freed": sorted(s for s, slot in before.items() if s not in now or now[s]["id"] != slot["id"]),
        "admitted": sorted((slot["id"], s) for s, slot in now.items() if slot["id"] in trace.steps[step].admitted),
        "held": sorted(
            (slot["id"], s)
            for s, slot in now.items()
            if slot["state"] == "held" and (s not in before or before[s]["state"] != "held")
        ),  # fmt: skip
    }


@pytest.mark.parametrize("name", ALL)
def test_step_events_follow_the_records(traces, name):
    trace = traces[name]
    for step, record in enumerate(trace.steps):
        events, expected = step_events(trace, step), events_by_loop(trace, step)
        assert events.freed == expected["freed"] and sorted(events.admitted) == expected["admitted"]
        assert sorted(events.held) == expected["held"]
        assert events.finished == record.finished and events.preempted == record.preempted
        assert {rid for rid, _ in events.admitted} == set(record.admitted)  # everyone admitted got a seat
        line = describe(events, running=3)
        assert all(rid in line for rid in record.finished[:4] + record.preempted[:4])
        assert (line.startswith("no change")) == events.quiet


def test_step_events_tell_the_seed_storys_moments(traces):
    static, continuous, preempting = traces["static"], traces["continuous"], traces["preempting"]
    assert describe(step_events(static, 0)) == "q0 and q1 admitted (seats 0–1)"  # (the rest arrive later)
    batch_end = next(t for t in range(1, len(static.steps)) if len(step_events(static, t).freed) > 1)
    batch = [seat for seat, slot in enumerate(static.steps[batch_end - 1].slots) if slot]
    assert step_events(static, batch_end).freed == batch  # the whole batch leaves at once
    assert describe(step_events(static, batch_end)).startswith(f"seats {batch[0]}–{batch[-1]} freed, ")
    held = next(t for t in range(len(static.steps)) if step_events(static, t).held)
    assert "held idle until the batch is done" in describe(step_events(static, held))
    assert not any(step_events(continuous, t).held for t in range(len(continuous.steps)))  # continuous never holds
    handover = next(t for t in range(1, len(continuous.steps))
                    if step_events(continuous, t).freed and step_events(continuous, t).admitted)  # fmt: skip
    events = step_events(continuous, handover)
    if [s for _, s in events.admitted] == events.freed:  # the seat freed is the seat taken: said once
        assert describe(events) == f"seat {events.freed[0]} freed, {events.admitted[0][0]} admitted"
    preempted = next(t for t in range(len(preempting.steps)) if preempting.steps[t].preempted)
    assert "preempted (back to the queue)" in describe(step_events(preempting, preempted))


def test_describe_counts_what_it_does_not_name():
    many = StepEvents(7, freed=[1, 4, 6], admitted=[(f"r{i}", i) for i in range(6)], finished=[], preempted=[],
                      held=[])  # fmt: skip
    assert describe(many) == "seats 1, 4 and 6 freed, r0, r1, r2, r3 and 2 more admitted (seats 0–5)"
    assert describe(StepEvents(0, [], [], [], [], []), running=1) == "no change: 1 seat at work"
    assert "data-event" in event_html(7, "E & F") and "E &amp; F" in event_html(7, "E & F")


def test_the_player_says_what_happened_each_step(traces):
    player = TracePlayer(traces["continuous"], 600)
    for step in range(len(traces["continuous"].steps)):
        frame = player.frame(step)
        assert frame.event == describe(step_events(traces["continuous"], step), frame.metrics["busy_seats"])


# --- pictures a room can read -----------------------------------------------------------------------------------------
def test_a_chart_drawn_to_a_height_and_its_lettering(traces):
    """The presenter view draws its seat charts to a height (half a 720 px screen) and its names and ticks no smaller
    than text_px; a run's ids inside the seats only where they fit at that size."""
    raster = OccupancyRaster(traces["static"], 610, text_px=20, height=372)
    assert raster.frame(5).size == (610, 372 - (372 - TOP - raster.bottom) % 3)  # (whole rows of 3 seats)
    assert raster.font is None or raster.font.size >= 20
    thin = OccupancyRaster(traces["static"], 610, text_px=20, height=60)  # rows too thin for a 20 px id
    assert thin.font is None


def test_a_live_windows_axis_counts_the_servers_steps(traces):
    """A window of steps 726-... is labelled 726-..., not 0-300 (its caption and its axis agree)."""
    trace = traces["continuous"]
    window = type(trace)(trace.config | {"first_step": 726}, trace.requests, trace.steps)
    labels = [int(label.replace(",", "")) for _, label in live_player(window, 300).occupancy.ticks()]
    assert labels and all(726 <= v < 726 + 300 for v in labels) and labels == sorted(labels)
    step = np.diff(labels)[0] if len(labels) > 1 else 1
    assert all(v % step == 0 for v in labels)  # round numbers
    assert [label for _, label in OccupancyRaster(trace, 600).ticks()][0] == "0"
    raster = live_player(window, 300, 1100, text_px=14).occupancy
    edge = raster.left + raster.plot_w + 12
    assert all(x + font(14).getlength(label) / 2 <= edge for x, label in raster.ticks())  # none cut at the edge


def test_simulated_ticks_are_seconds_and_several(simulated):
    ticks = OccupancyRaster(simulated["static"], 610, axis_seconds=53.6, text_px=20).ticks()
    assert len(ticks) >= 3 and all(label.endswith(" s") for _, label in ticks)  # (once: "0 s", "50 s" only)


def test_colours_a_room_can_tell_apart():
    """Held seats stood out from empty ones on a laptop, not on a projector (pink on grey); requests A and B wore
    decode's blue and prefill's orange beside the seat chart."""
    distance = lambda a, b: float(np.linalg.norm(rgb255(a).astype(float) - rgb255(b).astype(float)))
    states = [STATE_COLORS[k] for k in (EMPTY, PREFILL, DECODE, HELD, STALLED)]
    assert min(distance(a, b) for i, a in enumerate(states) for b in states[i + 1 :]) >= 75
    assert distance(STATE_COLORS[HELD], STATE_COLORS[EMPTY]) >= 120  # (the pale red was 81 from the grey)
    others = states + [FREE_BLOCK, CACHED_FREE_BLOCK, "#555555", "#d5d5d5"]  # (and the KV map's stored, reserved)
    assert min(distance(c, o) for c in REQUEST_PALETTE for o in others) >= 75
    assert min(distance(a, b) for i, a in enumerate(REQUEST_PALETTE) for b in REQUEST_PALETTE[i + 1 :]) >= 60
    assert text_on("#ffd92f") == "#111111" and text_on("#d62728") == "#ffffff"  # a chip's id reads on its colour


def test_figures_never_run_into_each_other():
    """Each cell is at least as wide as the longest value (once "100%100%4"), and cells wrap onto a second row."""
    html = figures_html([("busy now", "100%", "", ""), ("busy so far", "100%", "", ""), ("waiting", "4", "", "")])
    assert f"repeat(auto-fit, minmax({figure_min_em(['100%', '100%', '4'])}em, 1fr))" in html
    assert figure_min_em(["100%"]) >= text_em("100%") * FIGURE_VALUE_EM > 4 * 0.5 * FIGURE_VALUE_EM
    assert figure_min_em(["12 of 16"]) > figure_min_em(["100%"])


def test_chips_and_headlines_for_a_projector():
    assert "white-space:nowrap" in chip("r17", "#2ca02c")  # never "r1" / "7"
    assert queue_html(["a"], {"a": "#2ca02c"}).startswith("<div data-queue>")
    line = headline_html("Seats busy, whole run:", [("static", "51%"), ("continuous", "99%")], one_line=True)
    assert "font-size:2.2rem" in line and line.count("data-headline") == 2 and '<div style="font-size:0.9' not in line


def test_smallest_text_of_a_figure():
    fig = plot_users_by_context(load_spec("llama-3.1-8b"), get_device("rtx-4090"), 4096)
    sizes = [t.get_fontsize() for t in fig.findobj(lambda a: hasattr(a, "get_fontsize") and a.get_text().strip()
                                                  if hasattr(a, "get_text") else False)]  # fmt: skip
    assert smallest_text_pt(fig) == min(sizes) and 5 <= smallest_text_pt(fig) <= 12
