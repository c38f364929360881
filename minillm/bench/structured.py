"""Output that obeys, measured: what a constraint's mask costs a step, a crowd, and the replies; speculation when
users sample.

mask_cost    B users counting down (all decoding), every one constrained by a pattern their replies already follow
             (REPLY), beside the same B unconstrained, in paired rounds: the extra step time (medians), per
             constrained row; and the constraint's own work per step timed directly (the masks gathered, their
             allowed counts, the -inf fill: layers/constrain.py, layers/sampling.py's allowed_logits). Same replies,
             token for token, so the two runs differ only by the masks.
crowd        the chat workload (everyone at once, replies to EOS) with every other request constrained (REPLY again),
             beside none.
valid_json   prompts asking for JSON, greedy: the shipped model's replies with no constraint, with json_object and
             with a json_schema: the share that parse (and follow the schema). The tiny model knows countdowns and
             spelling only: free, it writes no JSON; constrained, it must.
speculation  one seat sampling (temperature 0.5 and 1.0, greedy beside them): a countdown (the draft's best case) or
             spellings one after the other (it misses first letters), with the shipped draft guessing 4 tokens a
             step vs without: tokens/s (paired rounds, medians) and the share of guesses the rejection rule kept.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, replace

from minillm.bench.speculation import CROWDS, users
from minillm.config import EngineConfig, Sampling
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.grammar import compile_json_object, compile_regex, compile_schema
from minillm.grammar.automaton import DEAD
from minillm.layers import LayeredEngine, sampling
from minillm.layers.constrain import Constraints
from minillm.layers.drafters import DRAFT_CHECKPOINT, DRAFT_RETRAIN_HINT
from minillm.model.checkpoint import load_model
from minillm.model.tokenizer import decode, encode_prompt
from minillm.model.transformer import Transformer
from minillm.runs.metrics import busy_seats, draft_figures, summarize
from minillm.runs.workload import ChatKnobs, make_workload

REPLY = r"[0-9]+( [0-9]+)*|[a-z]+( [a-z]+)*"  # what every reply is (a countdown, a spelling): no token changes
ANSWER = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 24}, "digits": {"type": "integer"}},
          "required": ["word", "digits"], "additionalProperties": False}  # fmt: skip
JSON_ASKS = ("reply in JSON: spell {n}", "as a JSON object, count down from {n}", '{{"spell": {n}}}', "spell {n}")
SPECULATE, TEMPERATURES = 4, (0.0, 0.5, 1.0)


@dataclass(frozen=True)
class Sizes:
    batches: tuple[int, ...] = (1, 8, 32, 64)
    steps: int = 40  # decode steps timed per run (all seats busy)
    rounds: int = 3
    crowd: int = 32  # chat requests
    crowd_slots: int = 16
    asks: int = 24  # JSON-asking prompts
    spec_steps: int = 150  # steps timed per speculation run


FULL, QUICK = Sizes(), Sizes(rounds=2, steps=30, spec_steps=100)
TINY = Sizes(batches=(1, 4), steps=4, rounds=1, crowd=4, crowd_slots=2, asks=4, spec_steps=6)  # (the test's)


def engine_for(model, slots: int, speculate: int = 0, draft=None) -> LayeredEngine:
    """Continuous batching with no token budget (whole prompts at once), lean records."""
    cfg = EngineConfig(slots=slots, speculate=speculate, record_blocks=False)
    return LayeredEngine(model, ContinuousScheduler(token_budget=0), cfg, draft=draft)


def countdowns(batch: int, seed: int, constrained: bool) -> list[Request]:
    """B users counting down from 100-152 (speculation.users): replies of 290-499 tokens."""
    requests = users("countdown", batch, seed)
    for r in requests if constrained else []:
        r.sampling = replace(r.sampling, constraint=compile_regex(REPLY))
    return requests


class MaskClock:
    """Seconds spent in the constraint's own work (the constraint layer's masks and counts, the sampler's -inf fill),
    by wrapping those functions while a `with` lasts (the engine is not changed: the bench times what it calls).
    (Constraints' methods are wrapped on the class: every engine's constraint layer is timed.)"""

    NAMES = ((Constraints, "masks"), (Constraints, "allowed_counts"), (sampling, "allowed_logits"))

    def __enter__(self) -> MaskClock:
        self.seconds, self.saved = 0.0, [getattr(m, n) for m, n in self.NAMES]
        for (module, name), original in zip(self.NAMES, self.saved):
            setattr(module, name, self.timed(original))
        return self

    def timed(self, original):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return wrapper

    def __exit__(self, *exc) -> None:
        for (module, name), original in zip(self.NAMES, self.saved):
            setattr(module, name, original)


def decode_steps(model, batch: int, seed: int, constrained: bool, steps: int) -> tuple[float, float, list]:
    """(median step seconds, median seconds of constraint work in a step, the replies) over `steps` steps with all
    `batch` seats decoding (after the prefill step). Medians: a step that builds a state's mask (once per state),
    or that the machine's other work interrupts, moves no figure."""
    engine, walls, work = engine_for(model, batch), [], []
    requests = countdowns(batch, seed, constrained)
    for r in requests:
        engine.submit(r)
    engine.step()  # (the prefill: every prompt at once)
    with MaskClock() as clock:
        for _ in range(steps):
            before = clock.seconds
            record = engine.step()
            if busy_seats(record) < batch:
                break
            walls.append(record.wall_s)
            work.append(clock.seconds - before)
    return statistics.median(walls), statistics.median(work), [r.output_ids for r in requests]


def measure_mask_cost(model, z: Sizes) -> list[dict]:
    rows = []
    for batch in z.batches:
        plain, masked, work, same = [], [], [], True
        for round_ in range(z.rounds):  # paired: the same users with and without, round after round
            p, _, replies = decode_steps(model, batch, round_, False, z.steps)
            m, w, constrained = decode_steps(model, batch, round_, True, z.steps)
            plain, masked, work, same = plain + [p], masked + [m], work + [w], same and replies == constrained
        step, extra = statistics.median(plain), statistics.median(m - p for m, p in zip(masked, plain))
        rows.append({"batch": batch, "step_s": step, "constrained_step_s": statistics.median(masked),
                     "extra_s": extra, "extra_per_row_s": extra / batch, "extra_share": extra / step,
                     "work_s": statistics.median(work), "work_per_row_s": statistics.median(work) / batch,
                     "same_replies": same})  # fmt: skip
    return rows


def measure_crowd(model, z: Sizes) -> dict:
    """tokens/s of the chat crowd with every other request constrained (REPLY: their replies are countdowns and
    spellings) beside none constrained, paired rounds."""
    knobs = ChatKnobs(requests=z.crowd, rate=1000)
    rates: dict[str, list[float]] = {"none": [], "half": []}
    same = True
    for round_ in range(z.rounds):
        replies = {}
        for case in rates:
            requests = make_workload("chat", knobs, seed=round_)
            for r in requests[::2] if case == "half" else []:
                r.sampling = replace(r.sampling, constraint=compile_regex(REPLY))
            engine = engine_for(model, z.crowd_slots)
            for r in requests:
                engine.submit(r)
            rates[case].append(summarize(engine.run())["tokens_per_s"])
            replies[case] = [r.output_ids for r in requests]
        same = same and replies["none"] == replies["half"]
    none, half = statistics.median(rates["none"]), statistics.median(rates["half"])
    ratio = statistics.median(h / n for h, n in zip(rates["half"], rates["none"]))
    return {"requests": z.crowd, "slots": z.crowd_slots, "none_tokens_per_s": none, "half_tokens_per_s": half,
            "ratio": ratio, "same_replies": same}  # fmt: skip


def measure_valid_json(model, z: Sizes) -> list[dict]:
    """The share of replies that parse as a JSON object (and, for the schema, follow it), per constraint."""
    rng = random.Random(3)
    prompts = [JSON_ASKS[i % len(JSON_ASKS)].format(n=rng.randint(1, 999)) for i in range(z.asks)]
    rows = []
    for name, dfa in (("none", None), ("json_object", compile_json_object()), ("json_schema", compile_schema(ANSWER))):
        engine = engine_for(model, z.asks)
        asked = Sampling(constraint=dfa)
        requests = [Request(f"j{i}", encode_prompt(p), 200, prompt=p, sampling=asked) for i, p in enumerate(prompts)]
        for r in requests:
            engine.submit(r)
        engine.run()
        texts = [decode(r.output_ids) for r in requests]
        valid = [text for text in texts if parses(text, schema=name == "json_schema")]
        cut = [r for r in requests if r.finish_reason == "length"]  # (a constrained one: a prefix its pattern allows?)
        rows.append({"constraint": name, "replies": len(texts), "valid": len(valid), "rate": len(valid) / len(texts),
                     "cut_by_length": len(cut), "cut_valid_prefix": sum(dfa is not None and dfa.walk(0, r.output_ids)
                                                                        != DEAD for r in cut),
                     "mean_tokens": statistics.mean(len(r.output_ids) for r in requests),
                     "example": f"{prompts[0]} -> {texts[0][:60]}"})  # fmt: skip
    return rows


def parses(text: str, schema: bool) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if not schema:
        return isinstance(value, dict)
    return (
        isinstance(value, dict)
        and list(value) == ["word", "digits"]
        and isinstance(value["word"], str)
        and (len(value["word"]) <= 24 and isinstance(value["digits"], int) and not isinstance(value["digits"], bool))
    )


def one_user(model, draft, task: str, temperature: float, speculate: int, seed: int, steps: int):
    """(tokens/s over up to `steps` steps, the share of guesses kept) for one seat sampling: a countdown, or spellings
    one after the other (speculation.users)."""
    engine = engine_for(model, 1, speculate, draft)
    for i, request in enumerate(users(task, 1, seed)):
        request.sampling = Sampling(temperature=temperature, seed=100 * seed + i)
        engine.submit(request)
    tokens = seconds = 0.0
    for _ in range(steps):
        if not engine.has_work():
            break
        record = engine.step()
        tokens, seconds = tokens + record.tokens, seconds + record.wall_s
    figures = draft_figures(engine.trace())
    return tokens / seconds, figures["draft_acceptance"] if speculate else None


def measure_speculation(model, z: Sizes) -> list[dict]:
    draft = load_model(DRAFT_CHECKPOINT, next(model.parameters()).device, hint=DRAFT_RETRAIN_HINT)
    rows = []
    for task in CROWDS:
        for temperature in TEMPERATURES:
            plain, spec, kept = [], [], []
            for round_ in range(z.rounds):  # paired: the same user with and without, round after round
                plain.append(one_user(model, draft, task, temperature, 0, round_, z.spec_steps)[0])
                rate, acceptance = one_user(model, draft, task, temperature, SPECULATE, round_, z.spec_steps)
                spec, kept = spec + [rate], kept + [acceptance]
            rows.append({"task": task, "temperature": temperature, "k": SPECULATE,
                         "tokens_per_s": statistics.median(plain), "spec_tokens_per_s": statistics.median(spec),
                         "acceptance": statistics.median(kept),
                         "speedup": statistics.median(s / p for s, p in zip(spec, plain))})  # fmt: skip
    return rows


def bench_structured(model: Transformer, s, sizes: Sizes | None = None) -> dict:
    z = sizes or (QUICK if s.quick else FULL)
    compile_json_object()  # (compiled once per process: about a second, not the bench's to time)
    return {"sizes": asdict(z), "pattern": REPLY, "mask_cost": measure_mask_cost(model, z),
            "crowd": measure_crowd(model, z), "valid_json": measure_valid_json(model, z),
            "speculation": measure_speculation(model, z)}  # fmt: skip


def markdown(r: dict) -> list[str]:
    lines = ["## 16. Output that obeys: what a constraint costs", "",
             f"B users counting down, all decoding, each constrained by `{r['pattern']}` (their replies already are: "
             "the same tokens come out, "
             + ("checked" if all(x["same_replies"] for x in r["mask_cost"]) else "**not** always, see the JSON")
             + "), beside the same users free: step time, medians of paired rounds; the constraint's own work (masks "
             "gathered, allowed counts, the -inf fill) timed inside the step.", "",
             "| users | step (ms) | constrained (ms) | extra per step (ms) | extra per row (µs) | share "
             "| mask work per row (µs) |", "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    lines += [f"| {x['batch']} | {x['step_s'] * 1e3:.2f} | {x['constrained_step_s'] * 1e3:.2f} | "
              f"{x['extra_s'] * 1e3:.2f} | {x['extra_per_row_s'] * 1e6:.0f} | {x['extra_share']:.0%} | "
              f"{x['work_per_row_s'] * 1e6:.0f} |" for x in r["mask_cost"]]  # fmt: skip
    c = r["crowd"]
    lines += ["", f"The chat workload, {c['requests']} requests at once on {c['slots']} seats, replies to EOS: "
              f"{c['none_tokens_per_s']:.0f} tokens/s with none constrained, {c['half_tokens_per_s']:.0f} with every "
              f"other one constrained (ratio {c['ratio']:.2f}; replies "
              f"{'the same' if c['same_replies'] else 'not all the same'}).", "",
              "Replies of the shipped model to prompts asking for JSON (greedy, at most 200 tokens):", "",
              "| constraint | valid JSON | cut by max tokens | mean tokens | first reply |",
              "|---|---:|---:|---:|---|"]  # fmt: skip
    cut = lambda x: f"{x['cut_by_length']}" + (f" ({x['cut_valid_prefix']} a prefix the pattern allows)"
                                               if x["constraint"] != "none" and x["cut_by_length"] else "")  # fmt: skip
    lines += [f"| {x['constraint']} | {x['valid']}/{x['replies']} ({x['rate']:.0%}) | {cut(x)} | "
              f"{x['mean_tokens']:.1f} | `{x['example']}` |" for x in r["valid_json"]]  # fmt: skip
    lines += ["", f"One seat sampling (a countdown from 100-152, or four spellings of 5-6 digits one after the other); "
              f"the shipped draft guessing k = {SPECULATE} per step, its guesses kept by the rejection rule (tokens/s, "
              "medians of paired rounds):", "",
              "| task | temperature | no speculation | k = 4 | speedup | guesses kept |",
              "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    lines += [f"| {x['task']} | {x['temperature']:g} | {x['tokens_per_s']:.0f} | {x['spec_tokens_per_s']:.0f} | "
              f"{x['speedup']:.2f}x | {x['acceptance']:.1%} |" for x in r["speculation"]]  # fmt: skip
    return lines + [""]
