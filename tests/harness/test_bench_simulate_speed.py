"""bench/simulate_speed.py runs, and skips with its reason where the full trace is not (a fresh
clone without ../shared/traces). Its timings are not checked: no test asserts a time. It
compiles the packages' bytecode before timing the command, and knows when it is current."""

from __future__ import annotations

import compileall
import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "simulate_speed.py"


def _bench(*args: str, traces_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BATCHLAB_TRACES_DIR": str(traces_dir)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def test_without_the_full_trace_it_says_so_and_skips(tmp_path: Path) -> None:
    done = _bench(traces_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"skipped: the full trace is not at {tmp_path}")


def test_on_a_given_trace_it_prints_its_figures_and_the_baseline(tmp_path: Path) -> None:
    done = _bench(str(REPO / "harness" / "data" / "azure_conv_excerpt.csv"), "--limit", "200",
                  "--no-cli", traces_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "decode spans (default)" in done.stdout
    assert "baseline: step by step" in done.stdout
    assert "identical results: True" in done.stdout


def _module() -> ModuleType:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        return importlib.import_module("simulate_speed")
    finally:
        sys.path.remove(str(REPO / "bench"))


def test_bytecode_is_current_only_once_compiled_from_the_source_as_it_is(tmp_path: Path
                                                                        ) -> None:
    bench = _module()
    source = tmp_path / "mod.py"
    source.write_text("X = 1\n")
    assert not bench._bytecode_current(source)  # never compiled
    assert compileall.compile_file(source, quiet=1)
    assert bench._bytecode_current(source)
    source.write_text("X = 22\n")  # edited since: another size
    os.utime(source, (1_000_000_000, 1_000_000_000))  # and another time
    assert not bench._bytecode_current(source)
    assert compileall.compile_file(source, quiet=1)
    assert bench._bytecode_current(source)


def test_bytecode_it_could_not_write_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    bench = _module()
    for package, module in (("harness", "mod"), ("adapters", "ok")):
        (tmp_path / package).mkdir()
        (tmp_path / package / f"{module}.py").write_text("X = 1\n")
    monkeypatch.setattr(bench, "__file__", str(tmp_path / "bench" / "simulate_speed.py"))
    real = compileall.compile_dir

    def read_only_harness(folder: Path, **kwargs: object) -> bool:
        return False if Path(folder).name == "harness" else real(folder, **kwargs)

    monkeypatch.setattr(bench.compileall, "compile_dir", read_only_harness)
    said = bench._compiled()
    assert "1 of 2 modules compiled first" in said
    assert "; 1 could not be written, and the command compiles them at each start" in said
    monkeypatch.setattr(bench.compileall, "compile_dir", real)
    assert bench._compiled().endswith("1 of 2 modules compiled first, as an installed "
                                      "package has them")  # the rest, now it can be
