"""The blocks a step moves, recorded and drawn: a reply's copy of its prompt's partly filled last block (replies.py's
fork), blocks written through to host memory and loaded back from it (tier.py). The trace's kv_moves sum to the
tier's events, survive a save and a load, and a trace from before them still loads; the KV map marks them and the
step player's caption counts them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from minillm.engine.request import Request
from minillm.layers.trace import KV_MOVES
from minillm.runs import trace_file
from tests.test_replies import engine, prompt_of
from tests.test_tier import returning_users, serve
from viz.app.playback import kv_html
from viz.kv_blocks import blocks_per_row, kv_block_refs, kv_blocks_rgb, plot_kv_blocks
from viz.player import TracePlayer

SIZE, CELL = 16, 12


@pytest.fixture(scope="module")
def replies():
    """Two prompts sent with n = 4: 40 tokens share 2 full blocks and copy a third (39 = 2 x 16 + 7); 33 share
    exactly 2 full blocks (32 tokens), so nothing is copied."""
    e = engine(block_size=SIZE)
    e.submit_replies(Request("a", prompt_of(40), 6, ignore_eos=True), 4)
    e.submit_replies(Request("b", prompt_of(33, seed=1), 6, ignore_eos=True), 4)
    return e.run()


@pytest.fixture(scope="module")
def tiered():
    """Returning users whose histories the device lets go and the host pool keeps (tests/test_tier.py)."""
    return serve(returning_users(), host_blocks=64).trace()


def moved(trace, name: str) -> list[tuple[int, int]]:
    return [(t, block) for t, step in enumerate(trace.steps) for block in step.kv_moves.get(name, [])]


def marks(trace, t: int) -> set[int]:
    """Blocks whose cell the step's marks changed (the map drawn with and without them)."""
    changed = (kv_blocks_rgb(trace, t, CELL) != kv_blocks_rgb(trace, t, CELL, moves={})).any(axis=2)
    cols = blocks_per_row(trace)
    return {int(y // CELL) * cols + int(x // CELL) for y, x in zip(*np.nonzero(changed))}


def inside(trace, t: int, block: int, right: bool) -> tuple:
    """A pixel inside the mark of `block` (top left for a copy, top right for a host move)."""
    cols, image = blocks_per_row(trace), kv_blocks_rgb(trace, t, CELL)
    x = (block % cols) * CELL + (CELL - 4 if right else 1)
    return tuple(image[(block // cols) * CELL + 2, x])


def test_each_sibling_copies_its_prompts_partly_filled_last_block_and_the_map_marks_it(replies):
    copies = moved(replies, "copied")
    assert len(copies) == 3, copies  # a's three siblings; b's prompt blocks are all full: shared, none copied
    (t,) = {t for t, _ in copies}
    step, blocks = replies.steps[t], [b for _, b in copies]
    for i in (1, 2, 3):  # each sibling's third block is its own copy; its first two are a's, held by all four
        table = step.kv_tables[f"a#{i}"]
        assert table[2] in blocks and table[:2] == step.kv_tables["a"][:2]
    refs = kv_block_refs(replies, t)
    assert all(refs[b] == 1 for b in blocks) and all(refs[b] == 4 for b in step.kv_tables["a"][:2])
    assert marks(replies, t) == set(blocks)
    assert all(inside(replies, t, b, right=False) == (255, 255, 255) for b in blocks)  # a white dog-ear
    legend = [text.get_text() for text in plot_kv_blocks(replies, t).axes[0].get_legend().get_texts()]
    assert "3 copied on write" in legend


def test_host_moves_sum_to_the_tiers_events_and_the_map_marks_them(tiered):
    events = tiered.config["tier_events"]
    written, loaded = moved(tiered, "to_host"), moved(tiered, "from_host")
    assert len(written) == events["written"] > 0 and len(loaded) == events["loaded"] > 0
    for t, block in written + loaded:  # a block moved is held by someone at its step
        assert any(block in table for table in tiered.steps[t].kv_tables.values()), (t, block)
    for t in {t for t, _ in written + loaded}:
        step = tiered.steps[t]
        assert marks(tiered, t) == set(step.kv_moves.get("to_host", []) + step.kv_moves.get("from_host", []))
    t, block = loaded[0]
    assert inside(tiered, t, block, right=True) == (0, 0, 0)  # a black triangle in the top right corner


def test_the_step_player_counts_them_on_a_line_every_frame_shows(tiered, replies):
    player = TracePlayer(tiered, 600)
    assert player.move_kinds == ["to_host", "from_host"]
    t = next(t for t, s in enumerate(tiered.steps) if "from_host" in s.kv_moves)
    frame = player.frame(t)
    assert frame.moves == {"from_host": len(tiered.steps[t].kv_moves["from_host"])}
    assert f"▼ {frame.moves['from_host']} loaded from host memory" in kv_html(player, frame)
    quiet = next(t for t, s in enumerate(tiered.steps) if not s.kv_moves)
    assert "none this step (marks: ▲ written to host memory, ▼ loaded from host memory)" in kv_html(
        player, player.frame(quiet)
    )
    forked = TracePlayer(replies, 600)  # no prefix caching: the caption still counts the forked blocks shared
    t = next(t for t, s in enumerate(replies.steps) if s.kv_moves)
    html = kv_html(forked, forked.frame(t))
    assert "; 4 shared by several requests" in html and "◸ 3 copied on write" in html  # (a's 2 full blocks, b's 2)


def test_kv_moves_round_trip_through_a_file_and_old_traces_load_without_them(tiered, tmp_path):
    tiered.save(tmp_path / "t.json")
    again = trace_file.load(tmp_path / "t.json")
    assert [s.kv_moves for s in again.steps] == [s.kv_moves for s in tiered.steps]
    data = tiered.to_dict()
    old = data | {"steps": [{k: v for k, v in s.items() if k != "kv_moves"} for s in data["steps"]]}
    before = trace_file.loads(json.dumps(old))
    assert not any(s.kv_moves for s in before.steps)
    player = TracePlayer(before, 600)
    assert player.move_kinds == [] and "data-kv-moves" not in kv_html(player, player.frame(0))


@pytest.mark.parametrize(
    "moves, needle",
    [({"teleported": [1]}, "unknown"), ({"to_host": [10_000]}, "not a list of blocks"), ([1], "got list")],
)
def test_a_file_with_wrong_moves_is_refused(tiered, moves, needle):
    data = json.loads(json.dumps(tiered.to_dict()))
    data["steps"][3]["kv_moves"] = moves
    with pytest.raises(trace_file.TraceError, match=needle):
        trace_file.from_dict(data)


def test_nothing_is_kept_without_block_tables():
    e = serve(returning_users(), host_blocks=64, record_blocks=False)
    assert e.trace().config["tier_events"]["loaded"] > 0
    assert not any(s.kv_moves for s in e.records) and not any(e.tier.moves.values())
    assert set(e.tier.moves) | set(e.replies.moves) == set(KV_MOVES)
