"""Who goes first, drawn (viz/verdicts.py, viz/targets.py): each request's class and whether it met its targets, as
known at the step shown, on the mixed crowd's runs (replayed, as the app serves them); runs without services drawn
as before."""

from html import unescape

import numpy as np
import pytest

from minillm.engine.scheduler import DEFAULT_TOKEN_BUDGET
from minillm.runs.metrics import judged, met_all, per_request, summarize
from tests.conftest import one_torch_thread
from viz.app import replays
from viz.app.step_player import DEFAULT_KNOBS
from viz.colors import DECODE, STATE_RGB, rgb255
from viz.html import occupancy_legend
from viz.player import TracePlayer
from viz.raster import TOP
from viz.targets import LIGHTEN, MET_COLOR, MISSED_COLOR, ServicePlayer, player_of
from viz.verdicts import MET, MISSED, PENDING, has_services, has_targets, verdicts_of

MIXED = {"workload": "mixed", "knobs": DEFAULT_KNOBS, "seed": 0, "slots": 8, "kv": "paged", "block_size": 16,
         "num_blocks": None, "token_budget": DEFAULT_TOKEN_BUDGET, "prefix_caching": False, "speculate": 0}  # fmt: skip
SIZE = {"width": 610, "text_px": 20, "height": 372}  # the presenter view's two panels

pytestmark = pytest.mark.usefixtures("app_in_process")  # (conftest.py: replies in memory, threads given back)


@pytest.fixture(scope="module")
def runs(shipped_model):
    """The app's mixed crowd (its replies ship with the model: no forward), first come first served and deadline;
    and the seed story, which carries no services."""
    with one_torch_thread():
        out = {name: replays.run(name, MIXED, shipped_model) for name in ("continuous", "deadline", "static")}
        out["seed-story"] = replays.run("continuous", MIXED | {"workload": "seed-story", "knobs": None, "slots": 4},
                                        shipped_model)  # fmt: skip
    return out


def late_chat_user(trace):
    """A chat user that waited past its TTFT target for its first token, and the first step that ended past it."""
    ends, figures = np.array([s.time_s for s in trace.steps]), per_request(trace)
    for r in trace.requests:
        target = r.service.get("ttft_s")
        if target is not None and figures[r.id]["ttft_s"] > target:
            arrived = trace.steps[r.arrival_step].time_s - trace.steps[r.arrival_step].wall_s
            arrived = arrived if r.arrival_s is None else r.arrival_s
            return r, int(np.searchsorted(ends, arrived + target, side="right"))
    raise AssertionError("first come first served kept no chat user waiting past its target")


@pytest.mark.parametrize("name", ["continuous", "deadline", "static"])
def test_each_verdict_is_the_metrics_judgement_as_known_at_the_step(runs, name):
    trace = runs[name]
    verdicts, last = verdicts_of(trace), len(trace.steps) - 1
    final = judged(trace)
    for step in [*range(0, last, 13), last]:
        now, known = verdicts.at(step), judged(trace, step)
        for i, r in enumerate(trace.requests):
            if r.id not in known:
                assert now[i] == PENDING  # not arrived yet
            elif r.finish_step is not None and r.finish_step <= step:
                assert now[i] == (MET if met_all(r, known[r.id], step) else MISSED), (r.id, step)
            elif now[i] == MISSED:  # known before it finished: the metrics say so once it has
                assert not met_all(r, final[r.id], last), (r.id, step)
            else:
                assert now[i] == PENDING, (r.id, step)
    counts = verdicts.counts(last)
    assert counts[""]["met"] == summarize(trace)["targets_met"] and counts[""]["pending"] == 0
    assert verdicts.classes == ["chat", "batch"]  # the most urgent class first


def test_first_come_first_served_misses_chat_users_and_the_deadline_policy_does_not(runs):
    assert verdicts_of(runs["continuous"]).counts(len(runs["continuous"].steps) - 1)["chat"]["missed"] > 0
    assert verdicts_of(runs["deadline"]).counts(len(runs["deadline"].steps) - 1)[""]["missed"] == 0


def test_a_missed_ttft_is_pending_until_its_target_passes_then_drawn_missed(runs):
    trace = runs["continuous"]
    r, passed = late_chat_user(trace)
    player = player_of(trace, **SIZE)
    i, chart = player.index[r.id], player.occupancy
    assert player.verdicts.at(passed - 1)[i] == PENDING and player.verdicts.at(passed)[i] == MISSED
    assert r.id in trace.steps[passed].waiting and r.arrival_step < passed  # it waited for a seat in the queue:
    assert r.id not in player.frame(passed - 1).marks and "data-missed" in player.frame(passed).marks[r.id]  # crossed
    seat_of = lambda step: int(np.flatnonzero(player.table.occupant[:, step] == i)[0])
    middle = (r.first_token_step + r.finish_step) // 2  # (its first steps may share a pixel with the one before)
    top_of_seat = TOP + seat_of(middle) * chart.row_h + 1, chart.left + int(chart.left_px[middle])
    assert tuple(np.asarray(chart.frame(r.finish_step))[top_of_seat]) == tuple(rgb255(MISSED_COLOR))  # a red band
    seat = seat_of(r.finish_step)
    [x0] = [x0 for step, at, x0, _ in chart.badges if step == r.finish_step and at == seat]
    top = TOP + seat * chart.row_h + (chart.row_h - chart.gap - chart.disc) / 2
    point = (int(top + 0.15 * chart.disc), int(x0 + chart.disc / 2))  # the disc's top, clear of the cross's arms
    assert tuple(np.asarray(chart.frame(r.finish_step))[point]) == tuple(rgb255(MISSED_COLOR))
    assert tuple(np.asarray(chart.frame(r.finish_step - 1))[point]) != tuple(rgb255(MISSED_COLOR))  # not yet drawn
    reply = next(reply for reply in player.frame(r.finish_step).replies if reply.id == r.id)
    assert "✗ missed: TTFT" in unescape(reply.service)


def test_a_met_request_gets_a_green_tick_where_it_finishes(runs):
    player = player_of(runs["deadline"], **SIZE)
    chart = player.occupancy
    step, seat, x0, verdict = chart.badges[0]
    assert verdict == MET
    top = TOP + seat * chart.row_h + (chart.row_h - chart.gap - chart.disc) / 2
    point = (int(top + 0.15 * chart.disc), int(x0 + chart.disc / 2))
    assert tuple(np.asarray(chart.frame(step))[point]) == tuple(rgb255(MET_COLOR))


def test_batch_jobs_seats_are_striped_and_chat_users_plain(runs):
    trace = runs["deadline"]
    player = player_of(trace, **SIZE)
    chart, table = player.occupancy, player.table
    picture = np.asarray(chart.frame(len(trace.steps) - 1))
    stripe = (STATE_RGB[DECODE] * (1 - LIGHTEN) + 255 * LIGHTEN).astype(np.uint8)
    striped = {"chat": 0, "batch": 0}
    for seat in range(table.num_seats):
        for step in range(0, table.num_steps, 5):
            i = table.occupant[seat, step]
            if i >= 0 and table.states[seat, step] == DECODE:  # (under the verdict band: the seat's lower rows)
                x = chart.left + int(chart.left_px[step])
                rows = picture[TOP + seat * chart.row_h + chart.row_h // 3 : TOP + (seat + 1) * chart.row_h - 4, x]
                striped[trace.requests[i].service["cls"]] += bool((rows == stripe).all(axis=1).any())
    assert striped["batch"] > 20 and striped["chat"] == 0


def test_the_legend_names_the_classes_and_the_marks(runs):
    player = player_of(runs["continuous"], **SIZE)
    legend = occupancy_legend(False, more=player.legend_items)
    assert 'data-class="chat"' in legend and 'data-class="batch"' in legend and legend.count("data-verdict") == 2
    figure = player.frame(400).more_figures
    assert [f[0] for f in figure] == ["met targets"] and "chat:" in figure[0][3] and "batch:" in figure[0][3]


def test_a_run_without_services_is_the_plain_player(runs):
    trace = runs["seed-story"]
    assert not has_services(trace) and not has_targets(trace) and has_targets(runs["deadline"])
    player = player_of(trace, **SIZE)
    assert type(player) is TracePlayer and not isinstance(player, ServicePlayer) and player.legend_items == ()
    frame = player.frame(12)
    assert frame.marks == {} and frame.more_figures == [] and all(r.service == "" for r in frame.replies)
    assert frame.occupancy_png == TracePlayer(trace, **SIZE).frame(12).occupancy_png
