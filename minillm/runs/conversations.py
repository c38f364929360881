"""A multi-turn workload: users who come back with their whole conversation after a think time.

A chat client sends the whole history every turn, so turn t+1's prompt is turn t's prompt, then its reply, then the
user's new message, token for token. A prefix cache that kept turn t's full blocks computes only the history's last,
partly filled block and the new message; one that lost them to other users computes the whole history again (a second
KV tier under the prefix cache is for that). The loop is closed: a user's next turn arrives `think` seconds after the
previous reply finished, on the engine's clock (simulated seconds on a card, the wall clock on the tiny model), so a
slow server also slows its users down, as real chat does.

Lengths come from published chat statistics (the sources are at each number below). The tiny model has a context of
1,024 tokens and answers only "count down from N" and "spell N", so its conversations are the published ones scaled
by TINY_SCALE, and its user messages are task prompts. It was trained on one exchange, not on a history, so every
reply runs to its drawn length with EOS ignored (the workloads' force-lengths semantics: ignore_eos=True,
max_new_tokens = the drawn length). A conversation whose next turn would not fit the context ends early.
On a simulated card (card/simulate.py: lengths only) the lengths are the published ones and the token ids are
placeholders that start with the user's number, so no two users share a block by accident.

Seam: after the step (an observer submits the next turn of each turn that finished).
Its state per user: the turns drawn for them (all drawn up front, so a run's script does not depend on finish order),
and why the conversation ended.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from minillm.card.simulate import MAX_NUM_SEQS, SimulatedRunner, default_token_budget
from minillm.config import EngineConfig
from minillm.engine.request import Request
from minillm.engine.scheduler import DEFAULT_TOKEN_BUDGET, Scheduler
from minillm.errors import ConfigError
from minillm.layers import LayeredEngine
from minillm.layers.policies import make_policy
from minillm.layers.trace import Trace
from minillm.model.tokenizer import BOS, EOS, SEP, encode, encode_prompt
from minillm.model.transformer import Transformer
from minillm.runs.workload import MAX_REPLY, poisson_arrivals, prompt_with_reply_length

# LMSYS-Chat-1M (Zheng et al., "LMSYS-Chat-1M: A Large-Scale Real-World LLM Conversation Dataset", ICLR 2024,
# arXiv 2309.11998), Table 1, one million conversations with 25 models, April-August 2023: "Avg. # Turns per
# Sample 2.0", "Avg. # Tokens per Prompt 69.5", "Avg. # Tokens per Response 214.5". The table gives means only: the
# shapes below (geometric turns, exponential lengths) are ours. Magpie (Xu et al., ICLR 2025, arXiv 2406.08464)
# Table 4, tiktoken counts, finds the same 2.01 turns and 260.37 +- 346.97 tokens per turn (prompt and reply): a
# standard deviation above the mean, so an exponential's tail (standard deviation = mean) is, if anything, short.
LMSYS_TURNS = 2.0
LMSYS_PROMPT_TOKENS = 69.5
LMSYS_REPLY_TOKENS = 214.5
# Magpie's Table 4 too: ShareGPT (112K conversations) "4.79" turns, 465.38 +- 368.37 tokens per turn; longer
# conversations than LMSYS's, a choice for mean_turns.
SHAREGPT_TURNS = 4.79
# Think time: no published distribution of how long chat users take between a reply and their next message was found.
# The serving benchmarks have none either: SGLang's benchmark/hicache/bench_multiturn.py queues a client's next round
# as soon as its reply is in (its ReadyQueue notes "todo, varying thinking time of clients"; defaults 5 rounds of 512
# prompt and 64 reply tokens), vLLM's benchmarks/multi_turn paces each client by --request-rate (generate_multi_turn
# .json: 12-18 turns of 120-160 prompt and 80-120 reply tokens). So THINK_S is an assumption, not a measurement: a
# mean of 5 s, exponential (think_spread=1), to change with the knobs.
THINK_S = 5.0
# The tiny model's scale: a quarter of the published lengths. A user message becomes ~17 tokens, the length of the
# tasks' own prompts ("count down from 40" is 20 tokens with BOS and SEP), a reply ~54 (the chat crowd's replies are
# 80 on average), and MAX_TURNS turns of mean length (8 x 71 = 568 tokens) stay well inside the 1,024 context.
TINY_SCALE = 0.25
# Turns cap: with 2 turns on average (geometric) a conversation runs past 8 turns once in 256.
MAX_TURNS = 8
PLACEHOLDER_USERS = 256 * 256  # a simulated card's user number takes two placeholder tokens


@dataclass
class ConversationKnobs:
    users: int = 16
    rate_per_s: float = 2.0  # users' first turns arrive Poisson, this many a second
    think_s: float = THINK_S  # mean seconds from a reply's end to the user's next turn
    think_spread: float = 1.0  # 0: every think is think_s; 1: exponential with that mean
    turns: int = MAX_TURNS  # at most this many turns per conversation
    mean_turns: float = LMSYS_TURNS  # turns per conversation on average, before the cap (geometric)
    seed: int = 0
    scale: float | None = None  # published lengths x scale; None: TINY_SCALE on the tiny model, 1 on a card

    def __post_init__(self) -> None:
        if not isinstance(self.users, int) or not 1 <= self.users <= PLACEHOLDER_USERS:
            raise ConfigError(f"users must be a whole number from 1 to {PLACEHOLDER_USERS}, got {self.users!r}")
        if self.rate_per_s <= 0:
            raise ConfigError(f"rate_per_s must be positive (users' first turns per second), got {self.rate_per_s}")
        if self.think_s < 0:
            raise ConfigError(f"think_s must be >= 0 seconds (0: the next turn comes at once), got {self.think_s}")
        if not 0 <= self.think_spread <= 1:
            raise ConfigError(f"think_spread must lie in [0, 1] (0: fixed, 1: exponential), got {self.think_spread}")
        if not isinstance(self.turns, int) or self.turns < 1:
            raise ConfigError(f"turns (the cap per conversation) must be a whole number >= 1, got {self.turns!r}")
        if self.mean_turns < 1:
            raise ConfigError(f"mean_turns must be at least 1 (every conversation has a first turn), got "
                              f"{self.mean_turns}")  # fmt: skip
        if self.scale is not None and self.scale <= 0:
            raise ConfigError(f"scale must be positive (published lengths x scale), got {self.scale}")


@dataclass
class Turn:
    """One turn of a user's script: the message it adds, the reply it asks for, the think before it."""

    text: str  # what the user writes (a placeholder's description on a simulated card)
    message: list[int]  # ids it adds to the history (the first turn: the whole prompt)
    reply: int  # tokens the reply runs to
    think: float  # seconds from the previous reply's end (the first turn: unused)


def draw_length(rng: random.Random, mean: float, least: int = 1, most: int | None = None) -> int:
    """An exponential length of that mean, kept in [least, most]."""
    length = max(least, round(rng.expovariate(1 / mean)))
    return length if most is None else min(most, length)


def draw_turns(rng: random.Random, mean: float, cap: int) -> int:
    """Geometric on 1, 2, ...: after each turn the user goes on with probability 1 - 1/mean."""
    turns = 1
    while turns < cap and rng.random() < 1 - 1 / mean:
        turns += 1
    return turns


def tiny_turn(rng: random.Random, first: bool, reply_mean: float) -> tuple[str, list[int], int]:
    """A task prompt whose reply is about the drawn length. A later message closes the reply before it with EOS, where
    the model would have stopped (a forced reply never produces it), as the training format frames one exchange."""
    reply = draw_length(rng, reply_mean, most=MAX_REPLY)
    text = prompt_with_reply_length(reply, rng)
    return text, encode_prompt(text) if first else [EOS, *encode(text), SEP], reply


def placeholder_turn(rng: random.Random, user: int, first: bool, scale: float) -> tuple[str, list[int], int]:
    """Lengths only: placeholder bytes; a first prompt starts with the user's number (two tokens), so every block of
    this user's history differs from every other user's (a block's key chains the keys before it)."""
    n = draw_length(rng, LMSYS_PROMPT_TOKENS * scale, least=4 if first else 2)
    reply, start = draw_length(rng, LMSYS_REPLY_TOKENS * scale), rng.randrange(256)
    body = [(start + 7 * j) % 256 for j in range(n)]
    ids = [BOS, user % 256, user // 256, *body[: n - 4], SEP] if first else [EOS, *body[: n - 2], SEP]
    return f"[user {user}: {len(ids)} message tokens, {reply} reply tokens]", ids, reply


class Conversations:
    """The users' scripts, and the observer that sends each user's next turn when the last one's reply is done."""

    def __init__(self, knobs: ConversationKnobs | None = None, simulated: bool = False):
        self.knobs = knobs = knobs or ConversationKnobs()
        self.simulated = simulated
        self.scale = knobs.scale if knobs.scale is not None else (1.0 if simulated else TINY_SCALE)
        self.scripts = [self.script(user) for user in range(knobs.users)]
        self.turn_of: dict[str, tuple[int, int]] = {}  # request id -> (user, turn)
        self.ended: dict[int, str] = {}  # user -> why the conversation ended ("done", "context", a finish reason)
        self.context: int | None = None  # the engine's max_len, once attached

    def script(self, user: int) -> list[Turn]:
        """A user's turns, drawn from their own seeded generator (a run's script never depends on finish order)."""
        rng = random.Random(f"{self.knobs.seed}:{user}")
        count, turns = draw_turns(rng, self.knobs.mean_turns, self.knobs.turns), []
        for t in range(count):
            if self.simulated:
                text, ids, reply = placeholder_turn(rng, user, t == 0, self.scale)
            else:
                text, ids, reply = tiny_turn(rng, t == 0, LMSYS_REPLY_TOKENS * self.scale)
            spread = self.knobs.think_spread
            think = self.knobs.think_s * (1 - spread + spread * rng.expovariate(1.0))
            turns.append(Turn(text, ids, reply, think))
        return turns

    def first_turns(self) -> list[Request]:
        """Every user's first turn, arriving Poisson at knobs.rate_per_s (the first at 0 s). Attached first, the driver
        leaves out a first turn that the engine's context cannot hold (that conversation ends before it starts)."""
        rng = random.Random(f"{self.knobs.seed}:arrivals")
        starts = poisson_arrivals(self.knobs.users, self.knobs.rate_per_s, rng)
        firsts = [(user, self.scripts[user][0], at) for user, at in enumerate(starts)]
        for user, first, _ in firsts:
            if not self.fits(first.message, first.reply):
                self.ended[user] = "context"
        return [self.request(user, 0, first.message, at) for user, first, at in firsts if user not in self.ended]

    def fits(self, prompt_ids: list[int], reply: int) -> bool:
        """Whether a turn fits the context (the engine rejects prompt + max_new_tokens past it)."""
        return self.context is None or len(prompt_ids) + reply <= self.context

    def request(self, user: int, turn: int, prompt_ids: list[int], arrival_s: float) -> Request:
        step = self.scripts[user][turn]
        history = len(prompt_ids) - len(step.message)
        text = step.text if turn == 0 else f"[turn {turn + 1}, {history} tokens of history] {step.text}"
        rid = f"u{user}t{turn}"
        self.turn_of[rid] = (user, turn)
        return Request(rid, prompt_ids, step.reply, ignore_eos=True, prompt=text, arrival_s=arrival_s,
                       planned_reply=step.reply)  # fmt: skip

    def attach(self, engine) -> None:
        """Watch `engine`'s steps; each finished turn sends its user's next one there."""
        self.context = engine.max_len
        engine.observers.append(self.after_step)

    def after_step(self, engine, step) -> None:
        for request in step.finished:
            if request.id in self.turn_of:
                self.follow(engine, request)

    def next_turn(self, request: Request) -> Request | None:
        """The user's next turn after `request` (None: the conversation is over, the reason in `ended`)."""
        user, turn = self.turn_of[request.id]
        if request.finish_reason not in ("length", "eos"):  # aborted, or ended by a layer: the user leaves
            self.ended[user] = request.finish_reason or "unfinished"
            return None
        if turn + 1 == len(self.scripts[user]):
            self.ended[user] = "done"
            return None
        after = self.scripts[user][turn + 1]
        history = request.prompt_ids + request.output_ids + after.message
        if not self.fits(history, after.reply):
            self.ended[user] = "context"  # the next turn and its reply would not fit: the conversation ends here
            return None
        return self.request(user, turn + 1, history, request.finish_s + after.think)

    def follow(self, engine, request: Request) -> None:
        following = self.next_turn(request)
        if following is not None and not engine.submit(following):
            self.ended[self.turn_of[following.id][0]] = following.finish_reason  # rejected: the user gives up


def conversation_engine(
    model: Transformer | SimulatedRunner,
    knobs: ConversationKnobs | None = None,
    scheduler: str | Scheduler = "continuous",
    token_budget: int | None = None,
    **cfg,
) -> tuple[LayeredEngine, Conversations]:
    """The engine with every user's first turn submitted and the driver attached, ready to run. `cfg` is
    EngineConfig's (slots, kv, num_blocks, prefix_caching...); as run.py's workload_engine, a simulated card gets
    its context, a pool sized by its memory, seats for as many conversations as that holds, and vLLM's token budget."""
    simulated = isinstance(model, SimulatedRunner)
    driver = Conversations(knobs, simulated)
    if token_budget is None:
        token_budget = default_token_budget(model) if simulated else DEFAULT_TOKEN_BUDGET
    policy = make_policy(scheduler, token_budget) if isinstance(scheduler, str) else scheduler
    k = driver.knobs
    meta = {"workload": "multi-turn", "seed": k.seed, "users": k.users, "think_s": k.think_s, "scale": driver.scale}
    if simulated:
        # seats for as many users as the pool (the card's, or num_blocks) holds at a whole conversation's length
        block = cfg.get("block_size", 16)
        typical = sum(len(t.message) + t.reply for script in driver.scripts for t in script) / k.users
        per_user, pool = -(-max(1, round(typical)) // block), cfg.get("num_blocks") or model.pool_blocks(block)
        cfg.setdefault("slots", max(1, min(MAX_NUM_SEQS, pool // per_user)))
        cfg = {"max_len": model.max_len, "record_blocks": False} | cfg
        meta |= {"model": model.spec.name, "gpu": model.card.name, "dtype": model.dtype, "kv_dtype": model.kv_dtype}
    cfg.setdefault("slots", 8)
    engine = LayeredEngine(model, policy, EngineConfig(**cfg), meta=meta)
    driver.attach(engine)
    for request in driver.first_turns():
        if not engine.submit(request):
            driver.ended[driver.turn_of[request.id][0]] = request.finish_reason
    return engine, driver


def run_conversations(model: Transformer | SimulatedRunner, knobs: ConversationKnobs | None = None, **kwargs) -> Trace:
    """Serve the conversations until every one has ended; return the trace. The engine runs while anything is pending:
    a next turn submitted for later (its arrival after the think) counts, so the loop waits for it (the wall clock
    sleeps, a simulated one jumps)."""
    engine, _ = conversation_engine(model, knobs, **kwargs)
    return engine.run()
