"""`pytest -m lessonNN` on a wrong solution: the diagnosis first, the whole output within 15 lines
(tests/lessons/plugin.py). Each case runs pytest in a subprocess on a wrong exercise file written here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.lessons.harness import CHECKS

ROOT = Path(__file__).resolve().parents[2]

LEFT_PADDING = """
    import torch
    from minillm.model.tokenizer import EOS, PAD


    @torch.no_grad()
    def generate_batch(model, prompts, max_new_tokens):
        rows, replies, done = [list(p) for p in prompts], [[] for _ in prompts], [False] * len(prompts)
        while not all(done):
            width = max(map(len, rows))
            logits = model(torch.tensor([[PAD] * (width - len(r)) + r for r in rows]))  # padded on the left
            for b, row in enumerate(rows):
                if done[b]:
                    continue
                token = logits[b, -1].argmax().item()
                if token == EOS:
                    done[b] = True
                    continue
                replies[b].append(token)
                row.append(token)
                done[b] = len(replies[b]) >= max_new_tokens
        return replies
"""

READS_ONE_EARLY = """
    import torch
    from minillm.model.tokenizer import EOS, PAD


    @torch.no_grad()
    def generate_batch(model, prompts, max_new_tokens):
        rows, replies, done = [list(p) for p in prompts], [[] for _ in prompts], [False] * len(prompts)
        while not all(done):
            width = max(map(len, rows))
            logits = model(torch.tensor([r + [PAD] * (width - len(r)) for r in rows]))
            for b, row in enumerate(rows):
                if done[b]:
                    continue
                token = logits[b, len(row) - 2].argmax().item()  # one position early: no known mistake
                if token == EOS:
                    done[b] = True
                    continue
                replies[b].append(token)
                row.append(token)
                done[b] = len(replies[b]) >= max_new_tokens
        return replies
"""

OLDEST_VICTIM = """
    from minillm.engine.scheduler import Plan


    class MyContinuousScheduler:
        name, holds_finished_seats = "mine", False

        def schedule(self, waiting, seats, kv):
            keep = sorted((r for r in seats if r is not None), key=lambda r: r.admit_order)
            victims, free = [], kv.free_blocks
            while keep and sum(kv.blocks_to_grow(r.seat) for r in keep) > free:
                victims.append(keep.pop(0))  # the oldest: wrong
                free += kv.blocks_held(victims[-1].seat)
            free -= sum(kv.blocks_to_grow(r.seat) for r in keep)
            admit, seats_left = [], seats.count(None) + len(victims)
            for r in waiting:
                cost = kv.blocks_to_admit(r.tokens_in_cache_after_prefill)
                if len(admit) == seats_left or cost > free:
                    break
                admit.append(r)
                free -= cost
            return Plan(admit=admit, preempt=victims)
"""


def run_check(tmp_path: Path, lesson: str, module: str, source: str, *options: str) -> tuple[int, list[str]]:
    """`pytest -m lessonNN` with the exercise package pointed at a folder holding `source` as `module`."""
    package = tmp_path / "wrong_exercises"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / f"{module}.py").write_text(textwrap.dedent(source))
    env = os.environ | {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "MINILLM_EXERCISES": "wrong_exercises"}
    env.pop("PYTEST_ADDOPTS", None)
    command = [sys.executable, "-m", "pytest", "-m", f"lesson{lesson}", "-p", "no:cacheprovider", *options]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, (done.stdout + done.stderr).rstrip().splitlines()  # (a blank first line would show)


@CHECKS
def test_a_wrong_loop_gets_its_hint_first(tmp_path):
    code, lines = run_check(tmp_path, "01", "lesson01_generate", LEFT_PADDING)
    assert code == 1, lines
    assert len(lines) <= 15, "\n".join(lines)
    assert lines[0].startswith("hint: padding on the LEFT"), "\n".join(lines)
    assert any("everything: pytest -m lesson01 --tb=long" in line for line in lines)
    assert lines[-2] == "lesson 01: failing (3 tests)" and "3 failed" in lines[-1]  # random model, edges, drawn batches
    assert any(line.startswith("also failing, ") for line in lines)


@CHECKS
def test_an_unknown_mistake_gets_the_plain_expected_and_got_line_first(tmp_path):
    """No hint where none applies, and the check's own diagnosis never crashes (it once raised IndexError replaying
    a known mistake that crashes on this case, and the student read "your code raised IndexError")."""
    code, lines = run_check(tmp_path, "01", "lesson01_generate", READS_ONE_EARLY)
    assert code == 1 and len(lines) <= 15, "\n".join(lines)
    assert lines[0].startswith("shipped model, four prompts (max_new_tokens=12): row 0: expected ["), "\n".join(lines)
    assert ", got [" in lines[0] and "hint:" not in "\n".join(lines) and "IndexError" not in "\n".join(lines)


@CHECKS
def test_a_wrong_policy_gets_its_diagnosis_first_and_one_line_per_other_failure(tmp_path):
    code, lines = run_check(tmp_path, "04", "lesson04_continuous", OLDEST_VICTIM)
    assert code == 1, lines
    assert len(lines) <= 15, "\n".join(lines)
    assert lines[0].startswith("step ") and "you preempted" in lines[0], "\n".join(lines)  # the referee's words
    assert "Traceback" not in "\n".join(lines) and "def " not in "\n".join(lines)
    assert any(line.startswith("also failing, ") for line in lines)


@CHECKS
@pytest.mark.slow
def test_an_explicit_tb_gives_pytests_own_report(tmp_path):
    code, lines = run_check(tmp_path, "01", "lesson01_generate", LEFT_PADDING, "--tb=short")
    assert code == 1 and any("FAILURES" in line for line in lines), "\n".join(lines)
