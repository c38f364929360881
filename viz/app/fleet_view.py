"""The step player's fleet view: two engines of the tiny model side by side, each drawn from its own trace.

    fleet: 2 replicas        a router (serving/routing.py: cache aware, least loaded or round robin) sends each arrival
                             to one of two replicas; the band under a request's seats says why it went there
    fleet: prefill + decode  prompts on one engine, replies on the other; each hand-over is marked where the request
                             leaves the prefill engine and where it lands on the decode engine, and said in words

The fleet runs in this process (fleet_run.py), replayed from each prompt's recorded reply like the step player's
other runs (replays.py). Each engine gets the step player's settings (seats,
block size, KV blocks, token budget, the crowd), on a paged cache; the seed story, the settings' default, stands for
the fleet's own crowd: lesson 13's (system prompts shared by many users for the replicas, long pasted texts for the
pair). The replicas always cache prefixes, in a pool smaller than the system prompts need together unless the settings
give one: then where a prompt goes matters. The headline: the fleet's prefix-hit rate (replicas); the most prompt
tokens a decoding user waited behind in one step, one engine serving the same crowd against the decode engine (pair).
"""

from __future__ import annotations

import json

import streamlit as st

from minillm.errors import MinillmError
from minillm.layers.trace import Trace
from viz.app import presenter, replays
from viz.app.headlines import headline_with_why
from viz.app.playback import Transport, play
from viz.app.trace_files import exports
from viz.fleet import REASONS, FleetPlayer, fleet_colors, handovers, hit_rate, reason_counts, waited_behind
from viz.html import occupancy_legend, swatch

REPLICAS, PAIR = "fleet: 2 replicas", "fleet: prefill + decode"  # the step player's choices (beside its schedulers)
CHOICES = [REPLICAS, PAIR]
ROUTERS = {"cache aware": "cache-aware", "least loaded": "least-loaded", "round robin": "round-robin"}
FLEETS = {f"{REPLICAS}, {name}": ("replicas", route) for name, route in ROUTERS.items()} | {PAIR: ("pair", None)}
ROUTER_HELP = ("how the router picks a replica (serving/routing.py, as serve --replicas 2 --route does): cache aware "
               "sends a prompt where its leading blocks are cached, unless under 2 blocks match or that replica is "
               "too busy")  # fmt: skip
LESSON_KNOBS = {"rate": 0.5, "spread": 1.0, "force_lengths": True}
FLEET_CROWDS = {  # lesson 13's crowds (the seed story in the settings stands for them)
    "replicas": ("system-prompt", {"requests": 32, "mean_reply": 20, **LESSON_KNOBS}),
    "pair": ("long-prompts", {"requests": 20, "mean_reply": 40, **LESSON_KNOBS}),
}
REPLICA_POOL_TOKENS = 1024  # each replica's KV pool unless the settings give one: lesson 13's 64 blocks of 16 tokens,
# fewer than the four system prompts take together (about 84 blocks)


def linked() -> tuple[str | None, str]:
    """The fleet a link opens on (?fleet=replicas or pair, &route=round-robin), and its router's name."""
    fleet, route = st.query_params.get("fleet"), st.query_params.get("route", "cache-aware")
    router = next((name for name, r in ROUTERS.items() if r == route), "cache aware")
    return {"replicas": REPLICAS, "pair": PAIR}.get(fleet), router


def fleet_settings(settings: dict, fleet: str, route: str | None) -> dict:
    """The fleet's run (its key on disk): the step player's settings on a paged cache, without speculation or
    constraints; the fleet's own crowd for the seed story; for the replicas the router, and prefix caching on."""
    run = {k: v for k, v in settings.items() if k != "constrained"} | {"kv": "paged", "speculate": 0, "fleet": fleet}
    if run["workload"] == "seed-story":
        run["workload"], run["knobs"] = FLEET_CROWDS[fleet]
    if fleet == "replicas":
        blocks = run["num_blocks"] or REPLICA_POOL_TOKENS // run["block_size"]
        run |= {"route": route, "prefix_caching": True, "num_blocks": blocks}
    return run


def one_engine_settings(run: dict) -> dict:
    """The same crowd and engine settings on one engine (the pair's headline compares with it)."""
    return {k: v for k, v in run.items() if k not in ("fleet", "route")}


@st.cache_resource(max_entries=6, show_spinner=False)
def cached_fleet(run_key: str, device: str, _model) -> list[Trace]:
    """The fleet's traces, one per engine, replayed (the model runs only for replies not recorded yet)."""
    return replays.run("fleet", json.loads(run_key), _model())


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_players(_traces: list[Trace], run_key: str, width: int, text_px: int, height: int | None
                   ) -> list[FleetPlayer]:  # fmt: skip
    colors, steps = fleet_colors(_traces), max(len(t.steps) for t in _traces)
    return [FleetPlayer(trace, colors, width, steps, text_px, height) for trace in _traces]


def titles(players: list[FleetPlayer]) -> list[str]:
    users = lambda p: f"{len(p.table.requests)} user{'s' * (len(p.table.requests) != 1)}"
    return [f"replica {i}: {users(p)}" if p.role == "replica" else f"{p.role} engine" for i, p in enumerate(players)]


def legend(players: list[FleetPlayer]) -> str:
    """The seat states, and the fleet's marks: the router's reasons with their counts, or the hand-over's marker."""
    tables = [p.table for p in players]
    counts = reason_counts(tables)
    more = [f"routed: {' &nbsp; '.join(f'{swatch(REASONS[r][0])}{REASONS[r][1]} {n}' for r, n in counts.items())}"]
    if any(p.role == "prefill" for p in players):
        more = ["▶ hand-over, in the request's colour"]
    return occupancy_legend(held=False, more=tuple(more))


def headline(players: list[FleetPlayer], one_engine: Trace | None, setting: str, row=None) -> None:
    """The fleet's one big number: the prefix-hit rate (replicas), or a decoding user's worst wait for a prompt on
    one engine against the decode engine (pair); why, and the fleet's setting (`setting`), one click away."""
    tables = [p.table for p in players]
    if players[0].role == "replica":
        cached, prompt = hit_rate(tables)
        route = players[0].table.config["route"].replace("-", " ")
        label, parts = "Prompt tokens from a prefix cache, both replicas:", [(route, f"{cached / max(prompt, 1):.0%}")]
        reasons = ", ".join(f"{n} {REASONS[r][2]}" for r, n in reason_counts(tables).items())
        note = (f"Of the {prompt:,} prompt tokens the users sent, {cached:,} came from the prefix cache of the replica "
                f"the router sent them to ({route}: {reasons}). Round robin and least loaded send a system prompt's "
                "users to both replicas, and each computes it; cache aware sends a user where its prompt's blocks "
                "are (lesson 13).")  # fmt: skip
    else:
        moved = handovers(tables[0])
        worst = waited_behind(tables[1])
        label = "Prompt tokens a decode step waited for:"
        alone = "–" if one_engine is None else f"{waited_behind(one_engine):,}"
        parts = [("one engine", alone), ("decode engine", f"{worst:,}")]
        kv = sum(tokens for *_, tokens in moved)
        note = (f"One engine serving the same crowd with the same settings ran up to {alone} prompt tokens in a step "
                "in which its users were decoding: each of them waited for those. The decode engine runs no prompt: "
                f"each ran on the prefill engine, and its KV crossed once ({len(moved)} hand-overs, {kv:,} prompt "
                "tokens' KV in all; lesson 13).")  # fmt: skip
    headline_with_why(label, parts, f"{setting} {note}", row)


def setup(run: dict, players: list[FleetPlayer]) -> str:
    """What the fleet is, in a sentence (behind the headline's why?)."""
    config = players[0].table.config
    engines = "two replicas" if run["fleet"] == "replicas" else "a prefill engine and a decode engine"
    pool = f"{config['slots']} seats and {config['num_blocks']} KV blocks of {config['block_size']} tokens each"
    crowd = f"{run['workload']} ({run['knobs']['requests'] if run['knobs'] else 8} users)"
    how = (f"the router ({run['route'].replace('-', ' ')}) sends each arrival to one; the band under a request's seats "
           "says why" if run["fleet"] == "replicas" else "after its first token each request's prompt KV is copied "
           "to the decode engine (layers/handover.py), marked in both charts in the request's colour")  # fmt: skip
    return (f"A fleet in this process, stepping together: {engines} of the tiny model, {pool}, serving {crowd}; "
            f"{how}.")  # fmt: skip


def show(settings: dict, device: str, schedule: str, transport: Transport, rows: list, model, one_engine) -> None:
    """The view. rows: the presenter view's columns (the trace popover's, then the headline's two); model: a callable
    returning the shipped model; one_engine(settings): the continuous trace of one engine (the pair's headline)."""
    fleet, route = FLEETS[schedule]
    run = fleet_settings(settings, fleet, route)
    run_key = json.dumps(run, sort_keys=True)
    try:
        with st.spinner(f"Running the fleet: {schedule.removeprefix('fleet: ')} on {run['workload']}…"):
            traces = cached_fleet(run_key, device, model)
    except MinillmError as e:
        st.error(f"{schedule}: {e}")
        return
    if not all(t.steps for t in traces):
        st.warning("Nothing to replay: every request was rejected (see the KV and seat settings).")
        return
    size = presenter.chart_size(2)
    fleet_players = cached_players(traces, run_key, size.width, size.text_px, size.height)
    players = list(zip(titles(fleet_players), fleet_players))
    exports(players, rows[0])
    baseline = one_engine(one_engine_settings(run)) if fleet == "pair" else None
    headline(fleet_players, baseline, setup(run, fleet_players), rows[1:] if presenter.on() else None)
    play(players, transport, legend=legend(fleet_players))
