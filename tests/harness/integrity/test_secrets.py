"""Secrets never reach a file: engine environment off the allow-list, the API key's value,
scenario ``env:`` and values after secret-named flags are redacted everywhere batchlab
writes (manifest, report, cell records, server logs)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from harness.redact import (
    MASK,
    redact_argv,
    redact_env,
    redact_tree,
    scrub_files,
    scrub_text,
    secret_values,
)

SECRETS = (b"abc123", b"zzz-auth-value", b"sk-test-987654")


def _files_holding(folder: Path, needles: tuple[bytes, ...]) -> list[str]:
    """Every file under ``folder`` (text or binary) that contains one of ``needles``."""
    return sorted(f"{p.relative_to(folder)}: {n.decode()}" for p in folder.rglob("*")
                  if p.is_file() for n in needles if n in p.read_bytes())


def test_environment_is_an_allow_list() -> None:
    env = {"HF_TOKEN": "abc123", "MY_AUTH": "zzz", "FOO": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "CUDA_VISIBLE_DEVICES": "0,1"}
    assert redact_env(env) == {"HF_TOKEN": MASK, "MY_AUTH": MASK, "FOO": MASK,
                               "VLLM_CPU_KVCACHE_SPACE": "1", "CUDA_VISIBLE_DEVICES": "0,1"}


def test_argv_redaction() -> None:
    command = ["batchlab", "replay", "--engine-env", "HF_TOKEN=abc123", "--engine-env=MY_AUTH=z",
               "--engine-env", "OMP_NUM_THREADS=2", "--extra-arg=--api-key", "--extra-arg=sk-1",
               "--extra-arg", "--hf-token=hf_x", "--extra-arg", "--dtype", "--extra-arg",
               "float32", "--api-key-env", "MY_KEY_VAR", "--max-num-batched-tokens", "512",
               "--tokenizer", "models/t"]
    assert redact_argv(command) == [
        "batchlab", "replay", "--engine-env", "HF_TOKEN=***", "--engine-env=MY_AUTH=***",
        "--engine-env", "OMP_NUM_THREADS=2", "--extra-arg=--api-key", "--extra-arg=***",
        "--extra-arg", "--hf-token=***", "--extra-arg", "--dtype", "--extra-arg", "float32",
        "--api-key-env", "MY_KEY_VAR", "--max-num-batched-tokens", "512", "--tokenizer",
        "models/t"]
    docker = ["docker", "run", "-e", "HF_TOKEN=abc", "-e", "PREFIX_CACHING=1", "img",
              "--api-key", "k1", "--disable-auth", "--port", "80"]
    assert redact_argv(docker) == ["docker", "run", "-e", "HF_TOKEN=***", "-e",
                                   "PREFIX_CACHING=1", "img", "--api-key", "***",
                                   "--disable-auth", "--port", "80"]


def test_records_are_redacted_at_any_depth() -> None:
    record = {"engine": {"env": {"SECRET_THING": "v"}, "extra_args": ["--api-key", "k"]},
              "mapping": [{"knob": "extra_args", "value": ["--api-key", "k"],
                           "flags": ["--api-key k"]}],
              "command": ["batchlab", "--engine-env", "A=b"], "other": ["--api-key", "k"]}
    assert redact_tree(record) == {
        "engine": {"env": {"SECRET_THING": MASK}, "extra_args": ["--api-key", MASK]},
        "mapping": [{"knob": "extra_args", "value": ["--api-key", MASK],
                     "flags": ["--api-key '***'"]}],
        "command": ["batchlab", "--engine-env", "A=***"], "other": ["--api-key", "k"]}


def test_logs_are_scrubbed_of_known_secret_values(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("BL_TEST_KEY", "sk-test-987654")
    secrets = secret_values(env={"HF_TOKEN": "abc123", "N": "1"},
                            argv=["serve", "--api-key", "api-secret"], api_key_env="BL_TEST_KEY")
    assert secrets == {"abc123", "api-secret", "sk-test-987654"}  # "1" would blank every 1
    log = tmp_path / "server.stderr.log"
    log.write_text("args: {'api_key': 'api-secret'} token abc123 rank 1\n")
    assert scrub_files(tmp_path, secrets) == 1
    assert log.read_text() == "args: {'api_key': '***'} token *** rank 1\n"


def test_engine_env_never_reaches_the_run_folder(tmp_path: Path, bl: type) -> None:
    """Issue case: `--engine-env HF_TOKEN=...` appeared verbatim in manifest.json (command)
    and report.md, and MY_AUTH passed the name-based masking."""
    out = tmp_path / "run"
    result = bl.run("replay", "--engine", "reference", "--launch", *bl.SMALL_TRACE,
                    "--engine-env", "HF_TOKEN=abc123", "--engine-env", "MY_AUTH=zzz-auth-value",
                    "--engine-env", "OMP_NUM_THREADS=1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    report = bl.run("report", str(out))
    assert report.returncode == 0, report.stderr
    assert (out / "report.md").exists()
    assert _files_holding(out, SECRETS) == []
    manifest = bl.read_json(out / "manifest.json")
    assert manifest["launch"]["env"]["OMP_NUM_THREADS"] == "1"
    assert manifest["launch"]["env"]["MY_AUTH"] == MASK
    assert "HF_TOKEN=***" in manifest["command"]
    for text in (result.stdout, result.stderr, report.stdout, report.stderr):
        assert not any(s.decode() in text for s in SECRETS)


def test_the_api_keys_value_never_reaches_the_run_folder(tmp_path: Path, loopback: str,
                                                         bl: type) -> None:
    out = tmp_path / "run"
    result = bl.run("replay", "--target", loopback, "--trace", "synthetic", "--num-requests",
                    "3", "--rate", "20", "--prompt-tokens", "8", "--output-tokens", "4",
                    "--api-key-env", "BL_TEST_KEY", "--out", str(out),
                    env={"BL_TEST_KEY": "sk-test-987654"})
    assert result.returncode == 0, result.stderr
    assert bl.read_json(out / "manifest.json")["replay"]["api_key_env"] == "BL_TEST_KEY"
    assert _files_holding(out, SECRETS) == []


def test_scenario_env_never_reaches_the_scenario_folder(tmp_path: Path, bl: type) -> None:
    scenario = tmp_path / "secret.yaml"
    scenario.write_text(textwrap.dedent("""\
        name: secret
        question: Does a scenario's engine env stay out of its files?
        trace: {path: azure_conv_excerpt.csv, limit: 3}
        model: llama-3.1-8b
        gpu: h100-sxm
        engines:
          - name: served
            engine: reference
            mode: live
            env: {HF_TOKEN: abc123, MY_AUTH: zzz-auth-value, OMP_NUM_THREADS: "1"}
    """))
    result = bl.run("run", str(scenario), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stdout + result.stderr
    folder = tmp_path / "out" / "secret"
    assert (folder / "report.md").exists() and (folder / "served" / "manifest.json").exists()
    assert _files_holding(folder, SECRETS) == []
    assert bl.read_json(folder / "served" / "cell.json")["engine"]["env"]["MY_AUTH"] == MASK


def test_a_key_cut_in_two_by_a_kept_length_is_masked_too() -> None:
    """An error body is kept only so long: a server echoing the key may have it cut at the
    end, and the part left is masked as the whole key would be."""
    key = "sk-LEAKTEST-0123456789abcdef"
    body = "x" * 250 + " invalid credentials: Bearer " + key
    for kept in (285, 295, len(body)):  # 6 and 16 characters of the key, and all of it
        text = scrub_text(body[:kept], [key])
        assert "sk-LEAK" not in text and text.endswith(MASK)
    assert scrub_text("no key here: sk-LE", [key]) == "no key here: sk-LE"  # 5: too few
    assert scrub_text("token sk-LEA", [key]) == f"token {MASK}"
    # a cut inside quotes, as a parse error quotes the chunk it could not read
    assert scrub_text(f"chunk is not JSON: {('x' * 190 + key)[:200]!r}", [key]).endswith(
        f"{MASK}'")
