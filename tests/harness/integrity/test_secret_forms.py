"""Secrets in the forms a second review planted: a flag and its value in ONE argv item
(``"--api-key sk-..."``), a key pasted for a scenario's ``api_key_env`` (also one that is a
valid variable name), an API key sharing its head with another secret, server logs readable by
anyone while the server runs, and a URL password holding an unescaped "/", "?" or "#".

Every value here is planted (``PLANTED``); none is a real credential."""

from __future__ import annotations

import os
import stat
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from adapters.process import LOG_MODE, ServerProcess
from harness.cli import main
from harness.live.config import ReplayConfig, target_url_problem
from harness.redact import (
    MASK,
    key_like_name,
    redact_argv,
    redact_tree,
    scrub_files,
    secret_values,
    stored_env_name,
)

SPACED_KEY = "sk-PLANTED-sp777"
SCENARIO_KEY = "sk-PLANTED-sp666"
API_KEY = "sk-PLANTED-1234567890abcdef"
NAME_LIKE_KEY = "hf_PLANTEDtoken0987654321"  # a key that is also a valid variable name


def _fake_engine(folder: Path) -> Path:
    """An "engine" that prints its argv and the keys of its environment, then exits 3."""
    script = folder / "fake-engine.sh"
    script.write_text("#!/bin/sh\necho \"fake engine argv: $*\"\n"
                      "echo \"env MYKEY=$MYKEY VLLM_API_KEY=$VLLM_API_KEY\"\n"
                      "echo \"stderr: argv $*\" >&2\nexit 3\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _everything(result: subprocess.CompletedProcess[str], folder: Path) -> str:
    files = [p.read_bytes().decode(errors="replace") for p in folder.rglob("*") if p.is_file()]
    return "\n".join([result.stdout, result.stderr, *files])


def _launch(tmp_path: Path, bl: Any, *flags: str) -> list[str]:
    return ["replay", "--engine", "vllm", "--launch",
            "--engine-executable", str(_fake_engine(tmp_path)), *bl.SMALL_TRACE, *flags,
            "--ready-timeout-s", "30", "--out", str(tmp_path / "run")]


# ---------------------------------------------------------------- F1. flag and value in one item


def test_an_item_holding_a_flag_and_its_value_is_masked_as_the_two_would_be() -> None:
    command = ["batchlab", "replay", f"--extra-arg=--api-key {SPACED_KEY}",
               "--extra-arg", "--hf-token  hf_PLANTEDone111", "--extra-arg=--dtype float16",
               "--extra-arg", "--port 80 --api-key k-PLANTED-1 k-PLANTED-2 --seed 3",
               "--extra-arg=--api-key=a-PLANTED b-PLANTED", "--extra-arg=-e HF_TOKEN=hfPLANTED9"]
    assert redact_argv(command) == [
        "batchlab", "replay", f"--extra-arg=--api-key {MASK}",
        "--extra-arg", f"--hf-token  {MASK}", "--extra-arg=--dtype float16",  # spaces kept
        "--extra-arg", f"--port 80 --api-key {MASK} {MASK} --seed 3",
        f"--extra-arg=--api-key={MASK}", f"--extra-arg=-e HF_TOKEN={MASK}"]
    assert secret_values(argv=command) == {
        SPACED_KEY, "hf_PLANTEDone111", "k-PLANTED-1", "k-PLANTED-2", "a-PLANTED b-PLANTED",
        "hfPLANTED9"}
    # a flag item followed by its value as the next item, and an engine's own argv
    assert redact_argv(["vllm", "--port 80 --api-key", "k-PLANTED-3"]) == [
        "vllm", "--port 80 --api-key", MASK]
    assert redact_argv(["vllm", f"--api-key {SPACED_KEY}"]) == ["vllm", f"--api-key {MASK}"]


def test_records_mask_a_flag_and_its_value_in_one_extra_args_item() -> None:
    record = {"knobs": {"extra_args": [f"--api-key {SCENARIO_KEY}", "--dtype float16"]},
              "mapping": [{"knob": "extra_args", "value": [f"--api-key {SCENARIO_KEY}"],
                           "flags": [f"'--api-key {SCENARIO_KEY}' --hf-token hfPLANTED8"]}]}
    assert redact_tree(record) == {
        "knobs": {"extra_args": [f"--api-key {MASK}", "--dtype float16"]},
        "mapping": [{"knob": "extra_args", "value": [f"--api-key {MASK}"],
                     "flags": [f"'--api-key {MASK}' --hf-token '{MASK}'"]}]}


def test_replay_keeps_a_spaced_extra_arg_key_out_of_console_and_files(tmp_path: Path,
                                                                      bl: Any) -> None:
    """Issue case: ``"--extra-arg=--api-key sk-..."`` reached the console (argv, log tail) and
    manifest.json (command, launch.argv, knobs, mapping, engine.error)."""
    result = bl.run(*_launch(tmp_path, bl, f"--extra-arg=--api-key {SPACED_KEY}"))
    assert result.returncode == 2, result.stderr
    assert "exited with code 3" in result.stderr and f"'--api-key {MASK}'" in result.stderr
    assert SPACED_KEY not in _everything(result, tmp_path / "run")


def test_a_scenario_extra_args_item_with_its_value_stays_out_of_every_file(tmp_path: Path,
                                                                           bl: Any) -> None:
    """Issue case: also report.md, scenario.json, cell.json, status.json, error.txt and the
    server logs."""
    scenario = tmp_path / "spaced.yaml"
    scenario.write_text(textwrap.dedent(f"""\
        name: spaced
        question: Is a flag and its value in one extra_args item masked?
        trace: {{path: synthetic, num_requests: 2, prompt_tokens: 8, output_tokens: 4, rate: 5}}
        model: llama-3.1-8b
        gpu: h100-sxm
        engines:
          - name: spaced
            engine: llamacpp
            model: m
            executable: {_fake_engine(tmp_path)}
            ready_timeout_s: 30
            knobs: {{extra_args: ["--api-key {SCENARIO_KEY}"]}}
    """))
    result = bl.run("run", str(scenario), "--out", str(tmp_path / "out"))
    folder = tmp_path / "out" / "spaced"
    assert (folder / "spaced" / "error.txt").exists(), result.stdout + result.stderr
    assert f"--api-key {MASK}" in (folder / "report.md").read_text()
    assert SCENARIO_KEY not in _everything(result, folder)


# ---------------------------------------------------------------- F2. a key for api_key_env


def test_a_key_given_for_api_key_env_is_masked_in_records() -> None:
    record = {"replay": {"api_key_env": API_KEY}, "other": {"api_key_env": NAME_LIKE_KEY},
              "kept": {"api_key_env": "MY_API_KEY"}, "none": {"api_key_env": None}}
    assert redact_tree(record) == {
        "replay": {"api_key_env": MASK}, "other": {"api_key_env": MASK},
        "kept": {"api_key_env": "MY_API_KEY"}, "none": {"api_key_env": None}}
    assert redact_argv(["b", "--api-key-env", NAME_LIKE_KEY, f"--api-key-env={NAME_LIKE_KEY}",
                        "--api-key-env", "OPENAI_API_KEY"]) == [
        "b", "--api-key-env", MASK, f"--api-key-env={MASK}", "--api-key-env", "OPENAI_API_KEY"]


@pytest.mark.parametrize(("name", "key_like"), [
    (NAME_LIKE_KEY, True), ("AKIAIOSFODNN7EXAMPLE", True), ("ghp_PLANTEDa1b2c3d4e5f6g7h8", True),
    ("VLLM_API_KEY", False), ("my_key_2", False), ("TOKENIZERS_PARALLELISM", False),
    ("OPENAI_API_KEY", False), ("VLLMCPUKVCACHESPACE", False), ("BATCHLAB_TEST_KEY", False),
])
def test_a_variable_name_that_looks_like_a_key(name: str, key_like: bool) -> None:
    assert key_like_name(name) is key_like
    assert stored_env_name(name) is not key_like


def test_an_unset_variable_is_refused_without_repeating_its_name(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue case: "environment variable hf_PLANTED... is not set" reached the console,
    report.md, status.json and error.txt: a key pasted for the name can be a name too."""
    monkeypatch.delenv(NAME_LIKE_KEY, raising=False)
    with pytest.raises(ValueError) as caught:
        ReplayConfig(target_url="http://127.0.0.1:9", api_key_env=NAME_LIKE_KEY).validate()
    assert "api_key_env: the environment variable it names is not set" in str(caught.value)
    assert NAME_LIKE_KEY not in str(caught.value)
    assert main(["serve", "reference", "--api-key-env", NAME_LIKE_KEY, "--port", "0"]) == 2
    said = capsys.readouterr()
    assert "--api-key-env: the environment variable it names is not set" in said.err
    assert NAME_LIKE_KEY not in said.out + said.err


def test_a_scenario_keeps_a_key_given_for_api_key_env_out_of_its_files(tmp_path: Path,
                                                                       bl: Any) -> None:
    """Issue case: scenario.json and cell.json held ``api_key_env: sk-...`` as given."""
    scenario = tmp_path / "paste.yaml"
    scenario.write_text(textwrap.dedent(f"""\
        name: paste
        question: Does a key pasted for api_key_env stay out of the scenario's files?
        trace: {{path: synthetic, num_requests: 2, prompt_tokens: 8, output_tokens: 4, rate: 5}}
        model: llama-3.1-8b
        gpu: h100-sxm
        engines:
          - name: nonname
            engine: openai
            url: http://127.0.0.1:9
            replay: {{api_key_env: {API_KEY}}}
          - name: named
            engine: openai
            url: http://127.0.0.1:9
            replay: {{api_key_env: {NAME_LIKE_KEY}}}
    """))
    env = {k: v for k, v in os.environ.items() if k != NAME_LIKE_KEY}
    result = subprocess.run(bl.batchlab("run", str(scenario), "--out", str(tmp_path / "out")),
                            cwd=bl.REPO, capture_output=True, text=True, env=env, timeout=300,
                            check=False)
    folder = tmp_path / "out" / "paste"
    assert (folder / "named" / "cell.json").exists(), result.stdout + result.stderr
    assert "the environment variable it names is not set" in (folder / "report.md").read_text()
    said = _everything(result, folder)
    assert API_KEY not in said and NAME_LIKE_KEY not in said


# ---------------------------------------------------------------- F3. keys that share a head


def test_an_api_key_sharing_its_head_with_another_secret_is_masked_whole(tmp_path: Path,
                                                                        bl: Any) -> None:
    """Issue case: the session scrubbed the logs without the API key first, masking only the
    head it shares with --engine-env's value: ``MYKEY=***1234567890abcdef`` stayed."""
    result = bl.run(*_launch(tmp_path, bl, "--api-key-env", "MYKEY",
                             "--engine-env", "VLLM_API_KEY=sk-PLANTED-enginekey99"),
                    env={"MYKEY": API_KEY})
    assert result.returncode == 2, result.stderr
    assert f"env MYKEY={MASK} VLLM_API_KEY={MASK}" in result.stderr
    said = _everything(result, tmp_path / "run")
    assert "1234567890abcdef" not in said and "PLANTED" not in said


# ---------------------------------------------------------------- F4. server logs, owner-only


def test_server_logs_are_owner_only_from_the_start(tmp_path: Path, bl: Any) -> None:
    """Issue case: the logs were 0644 and hold the server's secrets until the run scrubs them
    (for good when batchlab is killed)."""
    older = tmp_path / "fake.stderr.log"
    older.write_text("an earlier launch\n")
    older.chmod(0o644)
    server = ServerProcess(["/bin/sh", "-c", "echo sk-PLANTED-log1234"], log_dir=tmp_path,
                           name="fake")
    with server:
        server.start()
        assert stat.S_IMODE(server.stdout_path.stat().st_mode) == LOG_MODE  # while it runs
        assert stat.S_IMODE(older.stat().st_mode) == LOG_MODE  # an existing one tightened
        bl.wait_for(lambda: server.poll() is not None, "the server to print and exit")
    assert scrub_files(tmp_path, ["sk-PLANTED-log1234"]) == 1  # replaced: the mode kept
    assert server.stdout_path.read_text() == f"{MASK}\n"
    assert stat.S_IMODE(server.stdout_path.stat().st_mode) == LOG_MODE


# ---------------------------------------------------------------- F5. "/", "?", "#" in a password


@pytest.mark.parametrize("url", [
    "http://bob:pwPLANTED/secret42@127.0.0.1:1",  # urlsplit quoted 'pwPLANTED' as the port
    "http://bob:pwPLANTED#secret42@127.0.0.1:1",  # shown as 'http://bob:pwPLANTED?***'
    "http://bob:pwPLANTED?secret42@127.0.0.1:1",
    "http://bob:pwPLANTED/secret42@127.0.0.1:1/v1?k=secret43",
])
def test_a_refused_url_repeats_no_part_of_a_password_with_a_delimiter(
        url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    why = target_url_problem(url, "--target")
    assert why is not None and why.startswith("--target: 'http://***@127.0.0.1:1")
    assert "its port is not a number" in why
    assert main(["replay", "--target", url, "--model", "m", "--trace", "synthetic",
                 "--num-requests", "1", "--rate", "1", "--prompt-tokens", "8",
                 "--output-tokens", "4", "--out", str(tmp_path / "run")]) == 2
    said = capsys.readouterr()
    for shown in (why, said.out, said.err):
        assert "bob" not in shown and "PLANTED" not in shown and "secret4" not in shown


def test_a_parser_message_is_shown_without_what_it_quotes() -> None:
    """urlsplit quotes the text it read as a port, httpx a host: words kept, the quote not."""
    assert target_url_problem("http://h:99999", "u") == (
        "u: 'http://h:99999': not an http(s)://host[:port] URL (Port out of range 0-65535)")
    why = target_url_problem("http://999.1.1.1:80", "u")
    assert why is not None and why.endswith("(Invalid IPv4 address)")


def test_a_value_with_spaces_is_masked_whole_in_an_item_read_as_words() -> None:
    """In an item read as its words, a secret flag's ``=value`` runs on to the next flag; an
    item after a secret flag is its value, whatever it looks like."""
    from harness.redact import redact_argv, secret_values

    argv = ["x", "--extra-arg", "--port 80 --api-key=my pass phrase"]
    assert redact_argv(argv) == ["x", "--extra-arg", "--port 80 --api-key=***"]
    assert secret_values(argv=argv) == frozenset({"my pass phrase"})
    argv = ["x", "--hf-token", "-abc def"]
    assert redact_argv(argv) == ["x", "--hf-token", "***"]
    assert secret_values(argv=argv) == frozenset({"-abc def"})
    # a flag after the value ends it
    assert redact_argv(["x", "--extra-arg", "--api-key sk-PLANTED-1 --port 80"]) == [
        "x", "--extra-arg", "--api-key *** --port 80"]
