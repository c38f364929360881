"""The step player's fleet (viz/app/fleet_run.py) and its pictures (viz/fleet.py): two replicas behind the server's
router and a prefill engine handing requests to a decode engine, in this process; each engine's trace says what the
fleet did (why each request was routed where, which requests were handed over and when), and the seat charts and
event lines draw exactly that."""

import io

import numpy as np
import pytest
from PIL import Image

from minillm.engine.runner import ModelRunner
from minillm.model.tokenizer import decode as decode_tokens
from minillm.runs.run import run_workload
from minillm.runs.workload import ChatKnobs
from tests.conftest import one_torch_thread
from viz.app import fleet_run
from viz.colors import rgb255
from viz.events import describe, step_events
from viz.fleet import (
    HIGHLIGHT_STEPS,
    REASONS,
    FleetPlayer,
    fleet_colors,
    handovers,
    hit_rate,
    seat_spans,
    waited_behind,
)
from viz.raster import TOP, OccupancyRaster
from viz.table import table_of

BASE = {"seed": 0, "slots": 4, "kv": "paged", "block_size": 16, "token_budget": 0, "speculate": 0}
REPLICAS = BASE | {"fleet": "replicas", "workload": "system-prompt", "num_blocks": 64, "prefix_caching": True,
                   "knobs": {"requests": 16, "rate": 0.5, "mean_reply": 12, "force_lengths": True}}  # fmt: skip
PAIR = BASE | {"fleet": "pair", "workload": "long-prompts", "num_blocks": None, "prefix_caching": False,
               "knobs": {"requests": 10, "rate": 0.5, "mean_reply": 12, "force_lengths": True}}  # fmt: skip


@pytest.fixture(scope="module")
def fleets(shipped_model):
    with one_torch_thread():  # (the tiny model's ops are too small to split)
        model = lambda: ModelRunner(shipped_model)
        runs = {route: fleet_run.run(REPLICAS | {"route": route}, model) for route in fleet_run.ROUTES}
        runs["pair"] = fleet_run.run(PAIR, model)
        one = {k: v for k, v in PAIR.items() if k not in ("fleet", "workload", "knobs")}
        runs["one engine"] = run_workload(shipped_model, "long-prompts", knobs=ChatKnobs(**PAIR["knobs"]), **one)
        return runs


def test_every_engine_steps_at_every_step_of_the_fleet(fleets):
    for name in [*fleet_run.ROUTES, "pair"]:
        traces = fleets[name]
        assert len({len(t.steps) for t in traces}) == 1, name  # one time axis
        assert [s.step for s in traces[0].steps] == list(range(len(traces[0].steps)))
    served = [r.id for t in fleets["cache-aware"] for r in t.requests]
    assert sorted(served) == sorted(f"r{i}" for i in range(16))  # each request on one replica, once


def test_each_replica_says_why_the_router_sent_it_each_request(fleets):
    for route, reasons in [("round-robin", {"round_robin"}), ("least-loaded", {"least_loaded"}),
                           ("cache-aware", {"prefix_hit", "short_match", "overloaded"})]:  # fmt: skip
        for trace in fleets[route]:
            routed = trace.config["routed"]
            assert set(routed) == {r.id for r in trace.requests}
            assert {reason for reason, _ in routed.values()} <= reasons
    hits = [blocks for t in fleets["cache-aware"] for reason, blocks in t.config["routed"].values()
            if reason == "prefix_hit"]  # fmt: skip
    assert hits and min(hits) >= 2  # (a run shorter than 2 blocks does not steer: routing.MIN_MATCH_BLOCKS)
    rate = lambda route: np.divide(*hit_rate([table_of(t) for t in fleets[route]]))
    assert rate("cache-aware") > rate("round-robin")  # lesson 13: the router that knows the caches computes less


def test_a_handed_over_reply_is_the_one_engines_reply(fleets):
    """The pair's replies, the first token made on the prefill engine and the rest on the decode engine, are the
    replies one engine gives the same crowd (the KV crossed intact), and no decode step ran a prompt token. A reply
    of one token ends on the prefill engine."""
    prefill, decode = fleets["pair"]
    alone = {r.id: r.output_ids for r in fleets["one engine"].requests}
    handed = [r for r in prefill.requests if r.finish_reason == "handed-over"]
    assert handed and all(len(r.output_ids) == 1 for r in handed)
    ended = {r.id: r.output_ids for r in prefill.requests if r not in handed}
    assert all(len(alone[rid]) == 1 for rid in ended)
    assert {r.id: r.output_ids for r in decode.requests} | ended == alone
    assert waited_behind(decode) == 0 < waited_behind(fleets["one engine"])


def test_the_hand_overs_are_where_the_traces_say(fleets):
    prefill, decode = (table_of(t) for t in fleets["pair"])
    left, landed = handovers(prefill), handovers(decode)
    handed = [r.id for r in prefill.requests if r.finish_reason == "handed-over"]
    assert sorted(rid for rid, *_ in left) == sorted(handed) == sorted(rid for rid, *_ in landed)
    for rid, step, seat, tokens in left:
        r = prefill.requests[prefill.ids.index(rid)]
        assert step == r.finish_step and prefill.occupant[seat, step] == prefill.ids.index(rid)
        assert tokens == len(r.prompt_ids)
        event = describe(step_events(prefill, step))
        assert "handed over: " in event and rid in event and f"{rid} finished" not in event
    for rid, step, _, _ in landed:
        r = decode.requests[decode.ids.index(rid)]
        assert step == r.admit_step and r.arrival_step > prefill.requests[prefill.ids.index(rid)].finish_step
    first = left[0]
    assert f"{first[0]} handed over: {first[3]} prompt tokens' KV to the decode engine" in describe(
        step_events(prefill, first[1]))  # fmt: skip


def chart(player: FleetPlayer, step: int) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(player.frame(step).occupancy_png)).convert("RGB"))


def unmarked(player: FleetPlayer, step: int) -> np.ndarray:
    """The chart at `step` without the arrowheads a frame draws (the bands and notches are in the painting)."""
    return np.asarray(OccupancyRaster.frame(player.occupancy, step).convert("RGB"))


def test_routing_bands_are_painted_in_each_reasons_colour(fleets):
    traces = fleets["cache-aware"]
    for trace in traces:
        player = FleetPlayer(trace, fleet_colors(traces), 610, len(trace.steps), 20, 372)
        table, raster, picture = player.table, player.occupancy, chart(player, player.last_step)
        for i, runs in seat_spans(table).items():
            reason = trace.config["routed"][table.ids[i]][0]
            for seat, first, last in runs:
                x = raster.left + (raster.left_px[first] + raster.right_px[last]) // 2
                y = TOP + (seat + 1) * raster.row_h - 4  # in the band along the foot of the seat's row
                assert tuple(picture[y, x]) == tuple(rgb255(REASONS[reason][0])), (table.ids[i], reason)
        assert len(seat_spans(table)) == len(table.requests)  # every request seated, every one banded


def test_a_hand_over_is_drawn_in_both_charts_as_it_happens(fleets):
    """An arrowhead in the request's colour where it leaves the prefill engine and where it lands on the decode
    engine: not there the step before, there for HIGHLIGHT_STEPS steps, then gone (a notch stays); the decode
    engine's event line says the KV landed, and its chat shows the whole reply, the first token included."""
    traces = fleets["pair"]
    colors = fleet_colors(traces)
    prefill, decode = (FleetPlayer(t, colors, 610, len(t.steps), 20, 372) for t in traces)
    for player in (prefill, decode):
        rid, step, seat, _ = handovers(player.table)[1]  # (the second: the first lands at step 1, its run at 0)
        raster = player.occupancy
        base = raster.left + (raster.right_px[step] if player is prefill else raster.left_px[step])
        y, x = TOP + seat * raster.row_h + raster.row_h // 2, int(base + 0.2 * raster.row_h)  # inside the arrowhead
        assert tuple(chart(player, step - 1)[y, x]) == (255, 255, 255)  # not yet: the chart's future is blank
        assert tuple(chart(player, step)[y, x]) == tuple(rgb255(colors[rid]))
        assert (chart(player, step + HIGHLIGHT_STEPS - 1) != unmarked(player, step + HIGHLIGHT_STEPS - 1)).any()
        later = step + HIGHLIGHT_STEPS + 1
        marked_then = [m for m in handovers(player.table) if 0 <= later - m[1] < HIGHLIGHT_STEPS]
        assert marked_then or (chart(player, later) == unmarked(player, later)).all()
    rid, _, _, tokens = handovers(decode.table)[0]
    landing = decode.table.requests[decode.table.ids.index(rid)].arrival_step
    assert f"{rid}'s KV landed ({tokens} prompt tokens)" in decode.frame(landing).event
    reply = next(r for r in decode.frame(decode.last_step).replies if r.id == rid)
    alone = next(r for r in fleets["one engine"].requests if r.id == rid)
    assert reply.text == decode_tokens(alone.output_ids)
