"""An engine option that the chosen engine would never read is refused, on the command line and
in a scenario file. It used to be ignored without a word while the run folder recorded it:
``--container-runtime docker`` with vLLM ran vLLM natively, ``--engine-env`` given to an
attached server changed nothing on it, ``--metric-map`` with vLLM was not used."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.scenario import ScenarioError, load_scenario

REPO = Path(__file__).resolve().parents[3]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"
# nothing listens on port 9: a refusal must come before anything is sent
ATTACH = ["--url", "http://127.0.0.1:9", "--model", "m"]


@pytest.mark.parametrize(("engine", "flags", "said"), [
    ("vllm", ["--launch", "--container-runtime", "docker"],
     "--container-runtime applies to tgi only, not vllm: it would be ignored"),
    ("tgi", ["--launch", "--engine-executable", "/usr/bin/launcher"],
     "--engine-executable applies to vllm, trtllm, llamacpp, reference only, not tgi"),
    ("vllm", [*ATTACH, "--metric-map", "llamacpp"],
     "--metric-map applies to openai only, not vllm"),
    ("vllm", [*ATTACH, "--engine-env", "VLLM_X=1"],
     "--engine-env applies only to an engine batchlab launches, not to one it attaches to"),
    ("openai", [*ATTACH, "--port", "8000"],
     "--port applies only to an engine batchlab launches"),
])
def test_an_option_the_engine_never_reads_is_refused(
        engine: str, flags: list[str], said: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", "--engine", engine, *flags, "--trace", str(EXCERPT), "--limit", "2",
            "--out", str(tmp_path / "run")]
    if "--launch" in flags:
        argv += ["--model-path", str(tmp_path), "--dry-run"]
    assert main(argv) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_saying_native_is_accepted_for_every_engine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every engine but TGI runs natively: ``--container-runtime native`` changes nothing."""
    assert main(["replay", "--engine", "vllm", "--launch", "--model-path", str(tmp_path),
                 "--container-runtime", "native", "--trace", str(EXCERPT), "--limit", "2",
                 "--dry-run"]) == 0
    assert "ignored" not in capsys.readouterr().err


def scenario(tmp_path: Path, engine: str) -> Path:
    file = tmp_path / "s.yaml"
    file.write_text(textwrap.dedent("""\
        name: demo
        question: Which engine?
        trace:
          path: azure_conv_excerpt.csv
          limit: 3
        model: llama-3.1-8b
        gpu: h100-sxm
        engines:
          - name: e
        {engine}
        """).format(engine=textwrap.indent(engine, "    ")))
    return file


@pytest.mark.parametrize(("engine", "key", "said"), [
    ("engine: vllm\nruntime: podman", "engines[0].runtime",
     "applies to tgi only, not vllm: it would be ignored"),
    ("engine: tgi\nexecutable: /opt/tgi", "engines[0].executable",
     "applies to vllm, trtllm, llamacpp, reference only, not tgi: it would be ignored"),
    ("engine: vllm\nurl: http://127.0.0.1:9\nenv: {VLLM_X: '1'}", "engines[0].env",
     "applies only to an engine batchlab launches, not to one it attaches to"),
    ("engine: vllm\nurl: http://127.0.0.1:9\nport: 8000", "engines[0].port",
     "applies only to an engine batchlab launches"),
])
def test_a_scenario_key_the_engine_never_reads_is_refused_at_load(
        engine: str, key: str, said: str, tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(scenario(tmp_path, engine))
    assert info.value.key == key
    assert said in info.value.message


def test_the_same_keys_where_the_engine_reads_them_load(tmp_path: Path) -> None:
    loaded = load_scenario(scenario(tmp_path, "engine: tgi\nruntime: podman\nport: 8080\n"
                                              "env: {HF_X: '1'}"))
    assert loaded.engines[0].runtime == "podman" and loaded.engines[0].port == 8080
    loaded = load_scenario(scenario(tmp_path, "engine: vllm\nruntime: native\n"
                                              "executable: /opt/vllm/bin/python"))
    assert loaded.engines[0].executable == "/opt/vllm/bin/python"
