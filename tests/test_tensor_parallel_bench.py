"""`bench --only tp`'s pieces at a tiny size: the all-reduce microbenchmark between two processes, a step timed at
tp = 1 and tp = 2 on the same model, and the report's section."""

from __future__ import annotations

from minillm.bench.tensor_parallel import allreduce_curve, markdown, step_medians
from minillm.parallel.runner import ShardedRunner
from tests.conftest import random_model


def test_an_all_reduce_costs_more_for_more_bytes():
    # (sizes far enough apart that the bytes outweigh a loaded machine's scheduling: with 4 MiB, a 1 KiB median once
    # read 3.7 ms against 3.2 ms while the rest of the suite ran on both cores)
    small, big = 1024, 64 * 2**20
    medians = allreduce_curve([small, big], repeats=5)
    assert set(medians) == {small, big} and 0 < medians[small] < medians[big]


def test_a_step_is_timed_on_one_process_and_on_two():
    model = random_model("gqa")
    one = step_medians(model, [2], repeats=3)
    runner = ShardedRunner(model, 2)
    try:
        two = step_medians(runner, [2], repeats=3)
    finally:
        runner.close()
    assert one[2] > 0 and two[2] > 0


def test_the_report_says_what_was_measured():
    r = {"allreduce": [{"bytes": 1024, "seconds": 1e-4}, {"bytes": 2**24, "seconds": 0.01}],
         "steps": [{"size": "3m", "batch": 1, "tp1_s": 0.003, "tp2_s": 0.006, "speedup": 0.5, "allreduces": 8,
                    "allreduce_bytes": 1024}],
         "crowd": {"1": {"tokens_per_s": 1000.0}, "2": {"tokens_per_s": 500.0}},
         "crowd_same_replies": True}  # fmt: skip
    text = "\n".join(markdown(r, lambda name: []))
    assert "100 us for 1,024 bytes" in text and "| 3m | 1 | 3.00 ms | 6.00 ms | 0.50x | 8 (1,024) |" in text
    assert "1000 tokens/s at tp = 1, 500 at tp = 2" in text and "token for token: yes" in text
