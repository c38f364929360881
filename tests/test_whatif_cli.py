"""`whatif` and `calibrate` from the command line: answers, this-machine, and one clear line for bad input."""

import json

import pytest

from minillm.__main__ import main
from minillm.card import calibrate
from minillm.card.calibrate import Sizes
from minillm.card.hardware import this_machine
from minillm.card.measure import count_torch_calls

TINY_SIZES = Sizes(copy_mib=1, matmul_n=32, tiny_ops=20, repeats=2, op_by_op=False)  # the op-by-op rates: below


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_whatif_json_answers_the_workshop_question(capsys):
    code, out, _ = run_cli(capsys, "whatif", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--json")
    assert code == 0
    p = json.loads(out)
    assert p["params"] == 8_030_261_248 and p["weight_bytes"] == 2 * 8_030_261_248
    assert p["kv_bytes_per_token"] == 131072 and p["context"] == 4096 and p["batch"] == 1
    assert p["max_users"] == p["free_kv_bytes"] // (16 * 131072) // 256 == 12
    assert p["bound"] == "memory" and p["fits"]
    assert p["tokens_per_s"] == p["per_user_tokens_per_s"] == pytest.approx(1 / p["decode_step_s"])
    assert p["tokens_per_s"] < p["bandwidth_ceiling_tokens_per_s"]


def test_whatif_says_when_the_users_do_not_fit(capsys):
    code, out, _ = run_cli(capsys, "whatif", "--batch", "40")
    assert code == 0 and "they do not fit" in out and "40 users fit at 1,280 tokens each" in out
    code, out, _ = run_cli(capsys, "whatif", "--batch", "40", "--json")
    p = json.loads(out)
    assert not p["fits"] and p["at_fitting_context"]["context"] == p["max_context_at_batch"] == 1280
    assert p["tokens_per_s"] == pytest.approx(40 * p["per_user_tokens_per_s"])


def test_weights_that_do_not_fit_get_no_speed(capsys):
    code, out, _ = run_cli(capsys, "whatif", "--model", "llama-3.1-70b", "--gpu", "rtx-4090", "--json")
    p = json.loads(out)
    assert code == 0 and not p["weights_fit"] and not p["fits"] and p["max_users"] == 0
    speeds = ("decode_step_s", "tokens_per_s", "per_user_tokens_per_s", "single_user_tokens_per_s", "bound_step_s")
    assert all(p[key] is None for key in speeds)
    code, out, _ = run_cli(capsys, "whatif", "--model", "llama-3.1-70b", "--gpu", "rtx-4090")
    assert "do not fit" in out and "tokens/s in total" not in out


def test_one_user_is_one_user(capsys):
    code, out, _ = run_cli(capsys, "whatif", "--context", "32768", "--batch", "2")  # 6.3 GiB of KV, 4 GiB each
    assert code == 0 and "1 user fit at 32,768 tokens" in out and "1 users" not in out


def test_the_prediction_is_never_faster_than_the_bound(capsys):
    for batch in ("1", "64", "512"):
        code, out, _ = run_cli(capsys, "whatif", "--batch", batch, "--context", "1024", "--gpu", "h100-sxm", "--json")
        p = json.loads(out)
        assert p["bound_step_s"] <= p["decode_step_s"] * (1 + 1e-9)


def test_whatif_summary_has_the_memory_split_and_the_bound(capsys):
    code, out, _ = run_cli(capsys, "whatif", "--model", "qwen3-0.6b", "--gpu", "l4", "--kv-dtype", "fp8")
    assert code == 0
    for needle in ("memory", "weights", "KV", "users", "tokens/s in total", "per user", "bound"):
        assert needle in out


def test_whatif_takes_a_config_json_path(capsys, tmp_path):
    config = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 100}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, _ = run_cli(capsys, "whatif", "--model", str(tmp_path / "config.json"), "--json")
    assert code == 0 and json.loads(out)["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 2


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["--model", "gpt-5"], ["unknown model 'gpt-5'", "llama-3.1-8b", "qwen3-0.6b", "config.json"]),
        (["--gpu", "rtx-9090"], ["unknown GPU 'rtx-9090'", "rtx-4090", "h100-sxm", "this-machine"]),
        (["--context", "0"], ["--context must be at least 1"]),
        (["--batch", "0"], ["--batch must be at least 1"]),
        (["--dtype", "int3"], ["unknown weight dtype 'int3'", "fp8, int4"]),
        (["--kv-dtype", "int4"], ["unknown KV cache dtype 'int4'", "bf16, fp16, fp8"]),
        (["--context", "1000000"], ["--context 1,000,000 is longer than llama-3.1-8b was built for", "131,072"]),
        (["--tp", "3"], ["--tp 3 cannot split llama-3.1-8b", "32 query heads, 8 key/value heads", "1, 2, 4, 8"]),
        (["--tp", "0"], ["--tp must be a whole number of cards, at least 1"]),
        (["--tp", "2", "--link", "nvlink-9"], ["unknown link 'nvlink-9'", "nvlink-4, nvlink-3, pcie-4, pcie-5"]),
        (["--link", "nvlink-9"], ["unknown link 'nvlink-9'"]),
        (["--tp", "2", "--gpu", "apple-m2-ultra"], ["apple-m2-ultra has no link", "--link"]),
    ],
)
def test_bad_whatif_input_is_one_line(capsys, argv, needles):
    code, out, err = run_cli(capsys, "whatif", *argv)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    for needle in needles:
        assert needle in err


def test_whatif_tp_splits_a_70b_model_over_8_cards(capsys):
    code, out, _ = run_cli(capsys, "whatif", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "8")
    assert code == 0
    for needle in ("on 8 x NVIDIA H100 SXM", "tensor-parallel over NVLink 4", "memory    per card: 80.0 GiB",
                   "(1/8 of 131.4 GiB)", "KiB per token per card", "users fit at 4,096 tokens", "tokens/s in total",
                   "all-reduce 161 per step (2 per layer, 1 after the embedding)", "ms of the",
                   "share of a batch-1 step by tp: tp 1: 0%, tp 2:", "tp 8:", "over half the step",
                   "2048-token prompt chunk"):  # fmt: skip
        assert needle in out, needle
    code, out, _ = run_cli(capsys, "whatif", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "8", "--json")
    p = json.loads(out)
    assert p["tp"] == 8 and p["link"] == "nvlink-4" and p["weights_fit"] and p["max_users"] > 300
    assert p["weight_bytes"] < p["total_weight_bytes"] / 7 and 0 < p["comm_share"] < 0.5
    assert list(p["comm_share_by_tp"]) == ["1", "2", "4", "8"] and p["comm_dominates"].startswith("at no batch")


def test_whatif_link_overrides_the_cards_own(capsys):
    argv = ("whatif", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "8", "--batch", "64", "--json")
    nvlink, pcie = (json.loads(run_cli(capsys, *argv, *extra)[1]) for extra in ((), ("--link", "pcie-4")))
    assert nvlink["link"] == "nvlink-4" and pcie["link"] == "pcie-4"
    assert pcie["comm_s"] > nvlink["comm_s"] and pcie["tokens_per_s"] < nvlink["tokens_per_s"]
    code, out, _ = run_cli(capsys, "whatif", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "8", "--link",
                           "pcie-4")  # fmt: skip
    assert "tensor-parallel over PCIe 4.0 x16" in out


def test_calibrate_writes_a_small_json_in_the_user_cache(cache_home):
    result = calibrate.calibrate("cpu", TINY_SIZES, progress=False)
    path = cache_home / "minillm" / "calibration-cpu.json"
    assert path.is_file() and json.loads(path.read_text()) == result
    assert result["bandwidth"] > 0 and result["launch_s"] > 0 and result["flops"]["fp32"] > 0
    assert set(result["flops"]) <= {"fp32", "bf16"}
    machine = this_machine("cpu")
    assert machine.bandwidth == result["bandwidth"] and machine.efficiency == 1.0


def test_torch_calls_are_counted_views_and_methods_included():
    import torch

    x = torch.ones(4)
    assert count_torch_calls(lambda: torch.add(x, x).view(2, 2).sum()) == 3
    assert count_torch_calls(lambda: x.shape) == 0  # an attribute read is free


def test_calibrate_command(capsys, cache_home, monkeypatch):
    monkeypatch.setitem(calibrate.DEFAULT_SIZES, "cpu", TINY_SIZES)
    code, out, _ = run_cli(capsys, "calibrate", "--device", "cpu")
    assert code == 0 and "GB/s" in out and str(cache_home / "minillm" / "calibration-cpu.json") in out


def test_whatif_on_this_machine_reads_the_calibration(capsys, cache_home):
    saved = {"version": calibrate.VERSION, "device": "cpu", "name": "test cpu", "memory_bytes": 8 * 2**30,
             "bandwidth": 20e9, "flops": {"fp32": 1e11}, "launch_s": 5e-6, "measured_at": "now"}  # fmt: skip
    (cache_home / "minillm").mkdir()
    (cache_home / "minillm" / "calibration-cpu.json").write_text(json.dumps(saved))
    code, out, _ = run_cli(capsys, "whatif", "--model", "minillm-tiny", "--gpu", "this-machine",
                           "--device", "cpu", "--dtype", "fp32", "--context", "512", "--json")  # fmt: skip
    p = json.loads(out)
    assert code == 0 and p["gpu"] == "this-machine" and p["ridge_intensity"] == pytest.approx(1e11 / 20e9)


def test_calibration_measures_the_op_by_op_rates(cache_home):
    sizes = Sizes(copy_mib=1, matmul_n=32, tiny_ops=20, repeats=2, attention_points=((4, 15), (2, 31), (1, 63)),
                  chunks=(16,), rows=(1, 4), attention_heads=((4, 2, 8), (2, 1, 16)), stream_mib=(1, 4))  # fmt: skip
    cal = calibrate.calibrate("cpu", sizes, progress=False)
    assert cal["version"] == calibrate.VERSION and cal["threads"] == 1  # the one core the cost model describes
    assert set(cal["rows_flops"]) == {"256x64", "256x704", "512x1408", "1024x2816"}
    assert all(set(curve) == {"1", "4"} and min(curve.values()) > 0 for curve in cal["rows_flops"].values())
    assert len(cal["stream_bandwidth"]) == 2 and min(cal["stream_bandwidth"].values()) > 0
    assert set(cal["stream_by_shape"]) == set(cal["rows_flops"]) and min(cal["stream_by_shape"].values()) > 0
    assert 0 < cal["call_s"] < 1e-3
    assert set(cal["attention"]) == {"4x2x8", "2x1x16"}
    points = cal["attention"]["4x2x8"]
    shapes = [(p["sequences"], p["cached"], p["chunk"]) for p in points]
    assert shapes == [(4, 15, 1), (2, 31, 1), (1, 63, 1), (1, 0, 16)]
    assert points[0]["kv_bytes"] == points[1]["kv_bytes"]  # the same bytes in 4 rows and in 2
    assert calibrate.load_calibration("cpu") == cal


def test_an_older_calibration_file_is_measured_again(cache_home):
    (cache_home / "minillm").mkdir()
    (cache_home / "minillm" / "calibration-cpu.json").write_text(json.dumps({"device": "cpu", "bandwidth": 1.0}))
    assert calibrate.load_calibration("cpu") is None


def test_validate_predicts_and_times_each_point_and_saves_the_dots(cache_home):
    from minillm.card.validate import this_machine, validate, validation_text
    from tests.test_opcost import CAL

    cal = CAL | {"version": calibrate.VERSION, "name": "made up", "memory_bytes": 2**30, "bandwidth": 5e9,
                 "flops": {"fp32": 4e10}, "measured_at": "now", "seconds": 1.0}  # fmt: skip
    (cache_home / "minillm").mkdir()
    (cache_home / "minillm" / "calibration-cpu.json").write_text(json.dumps(cal))
    v = validate("cpu", sizes=("3m",), batches=(1, 3), contexts=(8,), chunks=(16,), budget_s=0.05, progress=False,
                 calibration=cal)  # fmt: skip
    assert [(r["batch"], r["context"], r["chunk"]) for r in v["rows"]] == [(1, 8, 0), (3, 8, 0), (1, 0, 16)]
    for r in v["rows"]:
        assert r["measured_s"] > 0 and r["samples"] >= 5 and r["calls"] > 100
        assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
        assert r["predicted_s"] == pytest.approx(sum(r["terms"].values()))
    errors = sorted(abs(r["error"]) for r in v["rows"][:2])
    assert v["per_size"]["3m"]["worst_abs_error"] == pytest.approx(errors[-1])
    assert v["prefill"]["points"] == 1 and "3m: decode median" in validation_text(v)
    here = this_machine("cpu")  # what the app shows for "this machine": the card and the saved dots
    assert here["card"].name == "this-machine" and here["card"].bandwidth == 5e9
    assert [(d["size"], d["batch"]) for d in here["dots"]] == [("3m", 1), ("3m", 3), ("3m", 1)]


@pytest.mark.cuda
def test_the_same_check_runs_on_a_gpu(cache_home):
    """`python -m minillm whatif --validate --device cuda`: calibrate the GPU, predict and time steps on it."""
    from minillm.card.validate import validate

    v = validate("cuda", sizes=("3m",), batches=(1, 16), contexts=(64,), chunks=(64,), budget_s=0.5, progress=False)
    assert v["device"] == "cuda" and v["calibration"]["device"] == "cuda" and len(v["rows"]) == 3
    for r in v["rows"]:
        assert r["measured_s"] > 0 and r["predicted_s"] > 0 and r["bound_s"] > 0
