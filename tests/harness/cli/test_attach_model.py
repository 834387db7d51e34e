"""``replay --engine E --url URL`` without --model: the running server says what it serves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.reference.config import ReferenceConfig
from harness.cli import main
from harness.serve.app import start_server_in_thread

REPO = Path(__file__).resolve().parents[3]
TRACE = REPO / "harness" / "data" / "azure_conv_excerpt.csv"


def test_an_attached_server_names_the_model_it_serves(tmp_path: Path) -> None:
    config = ReferenceConfig(model="qwen2.5-0.5b", max_model_len=512)
    with start_server_in_thread(config) as server:
        code = main(["replay", "--engine", "reference", "--url", server.url, "--trace",
                     str(TRACE), "--limit", "3", "--time-scale", "0.01", "--max-model-len",
                     "512", "--on-too-long", "clip", "--out", str(tmp_path / "run")])
    assert code == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["model"] == "qwen2.5-0.5b"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["num_completed"] == 3


def test_nothing_answering_says_no_server_answers(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Not "give --model": with nothing listening, no --model would help."""
    code = main(["replay", "--engine", "vllm", "--url", "http://127.0.0.1:9", "--trace",
                 str(TRACE), "--limit", "2", "--out", str(tmp_path / "run")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--engine vllm --url http://127.0.0.1:9: no server answers there" in err
    assert "/v1/models: ConnectError" in err and "give --model" not in err
