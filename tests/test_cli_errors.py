"""Bad input: one clear line naming the problem (and the fix), exit code 2, never a torch traceback."""

import pytest
import torch

from minillm.__main__ import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["--prompt", ""], ["prompt is empty"]),
        (["--prompt", "x" * 2000], ["context is 1024", "shorten the prompt"]),
        (["--prompt", "count down from 3", "--max-new-tokens", "0"], ["max_new_tokens must be at least 1"]),
        (["--prompt", "count down from 3", "--max-new-tokens", "5000"], ["use max_new_tokens <="]),
        (["--prompt", "count down from 3", "--temperature", "-1"], ["temperature must be a number >= 0"]),
    ],
)
def test_bad_generate_input(capsys, argv, needles):
    code, _, err = run_cli(capsys, "generate", *argv)
    assert code == 2
    assert err.startswith("error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_gpu_says_so(capsys):
    code, _, err = run_cli(capsys, "generate", "--prompt", "count down from 3", "--device", "cuda")
    assert code == 2 and "no CUDA GPU" in err and "--device cpu" in err


def test_missing_checkpoint_says_how_to_retrain(capsys, tmp_path):
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--checkpoint", str(tmp_path / "nope.safetensors"))
    assert code == 2 and "no checkpoint at" in err and "python -m minillm train" in err


def test_corrupt_checkpoint_says_how_to_retrain(capsys, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00garbage" * 10)
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--checkpoint", str(bad))
    assert code == 2 and "corrupt" in err and "python -m minillm train" in err


def test_generate_prints_the_reply(capsys):
    code, out, err = run_cli(capsys, "generate", "--prompt", "count down from 12")
    assert code == 0
    assert out.strip() == "12 11 10 9 8 7 6 5 4 3 2 1"
    assert "stopped by eos" in err and "nonsense" not in err


@pytest.mark.parametrize("prompt", ["count to 5", "spell 1234567", "count down from 153"])
def test_generate_warns_when_the_prompt_is_outside_the_training_tasks(capsys, prompt):
    code, _, err = run_cli(capsys, "generate", "--prompt", prompt, "--max-new-tokens", "3")
    assert code == 0 and "trained only on 'count down from N'" in err
