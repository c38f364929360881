"""`python -m minillm doctor`: every check passes on this install, and a failing one says what to do about it."""

import io
from importlib import metadata

import pytest

from minillm.cli import doctor, main


@pytest.mark.slow  # (the app and the lesson checks are imported in child processes: about 10 s on 2 cores)
def test_every_check_passes_here(capsys):
    assert doctor.run_checks() == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines[:-1]] == [["ok", name] for name in doctor.CHECKS]
    assert lines[-1].startswith("all good (")


def test_a_wrong_torch_prints_the_cpu_wheel_as_its_fix(monkeypatch):
    real = metadata.version
    monkeypatch.setattr(doctor.metadata, "version", lambda name: "2.3.1+cu121" if name == "torch" else real(name))
    out = io.StringIO()
    failed = doctor.run_checks({"python": doctor.check_python, "packages": doctor.check_packages}, out)
    text = out.getvalue()
    assert failed == 1 and "ok    python" in text
    assert "FAIL  packages  torch 2.3.1+cu121 (pinned 2.13.0)" in text
    assert "fix: pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text
    assert text.splitlines()[-1].startswith("1 of 2 checks failed")


def test_a_missing_package_and_a_broken_check_each_get_a_line(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(doctor.metadata, "version", missing)
    out = io.StringIO()
    broken = lambda: 1 / 0
    assert doctor.run_checks({"packages": doctor.check_packages, "broken": broken, "python": doctor.check_python}, out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("FAIL  packages  torch missing (pinned 2.13.0)")
    assert any(line.startswith("FAIL  broken    the check itself failed: ZeroDivisionError") for line in lines)
    assert any(line.startswith("ok    python") for line in lines)  # the others still run


def test_the_command_exits_non_zero_when_a_check_fails(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "CHECKS", {"model": lambda: doctor.Result(False, "no model", "git checkout")})
    with pytest.raises(SystemExit) as stop:
        main(["doctor"])
    assert stop.value.code == 1
    assert "FAIL  model     no model\n      fix: git checkout" in capsys.readouterr().out


def test_requirements_pins_are_read_with_their_markers(tmp_path):
    pins = tmp_path / "requirements.txt"
    pins.write_text('# a comment\ntorch==2.13.0\nuvloop==0.23.0; sys_platform != "win32"\nloose>=1\n')
    assert doctor.pinned(pins) == {"torch": "2.13.0", "uvloop": "0.23.0"}
