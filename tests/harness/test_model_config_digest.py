"""A model given as a path (a folder with a Hugging Face config.json, or the file) is part of
what a resumed sweep or capacity search checks: its config.json edited since, the results made
from the old one are not kept."""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path

import pytest

from harness import scenario as sc
from harness.cli import main

SHAPE = {  # Llama-3.1-8B's shape, as its config.json gives it
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}


def model_folder(path: Path, **changes: object) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**SHAPE, **changes}))
    return path


def test_resume_runs_again_the_cells_whose_model_config_changed(tmp_path: Path) -> None:
    """A sweep's cell digest covered its traces, lengths file and profile but not the model's
    config.json: with ``model: <folder>``, the file edited (32 layers to 80), --resume kept
    the results of the old shape. Now the cells reading it run again, the scenario's model
    and an engine's own ``model:`` alike, and only those."""
    shared = model_folder(tmp_path / "shared")
    own = model_folder(tmp_path / "own")
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: shapes
        question: How does the model's depth change the latency?
        trace:
          path: synthetic
          num_requests: 8
          rate: 4
          prompt_tokens: 64
          output_tokens: 8
        model: {shared}
        gpu: h100-sxm
        engines:
          - name: scenario_model
            engine: reference
          - name: own_model
            engine: reference
            model: {own / "config.json"}
        """))

    def sweep() -> dict[str, str]:
        result = sc.run_scenario(sc.load_scenario(path), tmp_path / "out", resume=True,
                                 write_report=False,
                                 progress=sc.SweepProgress(2, stream=io.StringIO(), tty=False))
        return {o.name: o.state for o in result.outcomes}

    assert sweep() == {"scenario_model": "done", "own_model": "done"}
    assert sweep() == {"scenario_model": "skipped", "own_model": "skipped"}
    model_folder(shared, num_hidden_layers=80)
    assert sweep() == {"scenario_model": "done", "own_model": "skipped"}
    model_folder(own, num_hidden_layers=80)
    assert sweep() == {"scenario_model": "skipped", "own_model": "done"}
    summaries = {cell: json.loads((tmp_path / "out" / "shapes" / cell / "summary.json")
                                  .read_text()) for cell in ("scenario_model", "own_model")}
    # both now measured on the 80-layer shape: the same engine, the same trace, one answer
    assert summaries["scenario_model"]["tpot_s"] == summaries["own_model"]["tpot_s"]


def test_capacity_resume_refuses_probes_of_a_model_config_since_edited(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A capacity search's digest covered its trace, lengths and profile files but not the
    model's config.json: the file edited, --resume reused the probes of the old shape. The
    resume is refused, naming the file, as with an edited trace or profile."""
    folder = model_folder(tmp_path / "model")
    args = ["capacity", "--model", str(folder), "--trace", "synthetic", "--num-requests", "20",
            "--prompt-tokens", "64", "--output-tokens", "8", "--start", "4",
            "--max-probes", "2", "--slo", "ttft_s=0.5", "--out", str(tmp_path / "cap")]
    assert main(args) == 0
    assert main([*args, "--resume"]) == 0  # nothing changed: resumed
    assert "(resumed)" in capsys.readouterr().err
    model_folder(folder, num_hidden_layers=80)
    assert main([*args, "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"changed: the bytes of {(folder / 'config.json').resolve()}" in err
