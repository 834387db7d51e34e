"""Secrets stay out of what batchlab prints as well as what it writes: a launch that fails
(validate, calibrate), URL credentials (``http://user:pass@host``), the several values of
vLLM's ``--api-key``, secrets made of digits, malformed ``--engine-env`` items and a key
pasted where a variable NAME belongs."""

from __future__ import annotations

import asyncio
import json
import stat
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from adapters.base import LaunchPlan, shown_url
from adapters.process import EngineStartError, wait_healthy
from harness.live.config import ReplayConfig, target_url_problem
from harness.live.session import engine_session
from harness.redact import (
    MASK,
    env_var_name,
    redact_argv,
    redact_tree,
    redact_url,
    scrub_files,
    scrub_text,
    secret_values,
)
from harness.runfolder import RunIdentity
from harness.target import TargetSpec

PROFILE = "adapters/reference/profiles/vllm-h100-sxm.json"
TRACE = "harness/data/azure_conv_excerpt.csv"
URL_PASSWORD = "PWurlSECRET77"
URL = f"http://bob:{URL_PASSWORD}@127.0.0.1:9"  # port 9 (discard): nothing listens


def _fake_engine(folder: Path) -> Path:
    """An "engine" that prints its argv and its secret-looking environment, then exits 3."""
    script = folder / "fake-engine.sh"
    script.write_text("#!/bin/sh\necho \"ARGV: $*\"\nenv | grep -i 'token\\|auth'\n"
                      "echo \"ERR ARGV: $*\" >&2\nexit 3\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _everything(result: subprocess.CompletedProcess[str], folder: Path) -> str:
    """What a command printed and every file it left, as one text."""
    files = [p.read_bytes().decode(errors="replace") for p in folder.rglob("*") if p.is_file()]
    return "\n".join([result.stdout, result.stderr, *files])


# ---------------------------------------------------------------- 1. validate and calibrate


LAUNCH_SECRETS = ("hfFAKEENVSECRET9", "sk-FKSECRET1234", "sk-FKSECOND5678", "98765432109876")


def _failing_launch(tmp_path: Path) -> list[str]:
    return ["--engine", "vllm", "--launch", "--model-path", str(tmp_path / "model"),
            "--engine-executable", str(_fake_engine(tmp_path)),
            "--engine-env", f"HF_TOKEN={LAUNCH_SECRETS[0]}",
            "--engine-env", f"MY_AUTH={LAUNCH_SECRETS[3]}",
            "--extra-arg=--api-key", f"--extra-arg={LAUNCH_SECRETS[1]}",
            f"--extra-arg={LAUNCH_SECRETS[2]}", "--model", "llama-3.1-8b",
            "--ready-timeout-s", "60"]


def test_validate_that_cannot_launch_prints_no_secret(tmp_path: Path, bl: Any) -> None:
    """Issue case: validate quoted the engine's argv and log tail as they were."""
    out = tmp_path / "validate"
    result = bl.run("validate", *_failing_launch(tmp_path), "--profile", PROFILE,
                    "--trace", TRACE, "--limit", "2", "--out", str(out))
    assert result.returncode == 2, result.stderr
    assert "exited with code 3 before it was ready" in result.stderr
    assert "--api-key', '***', '***'" in result.stderr  # the argv is still quoted, masked
    assert "HF_TOKEN=***" in result.stderr  # and the log tail
    said = _everything(result, out)
    assert [s for s in LAUNCH_SECRETS if s in said] == []


def test_calibrate_that_cannot_launch_prints_no_secret(tmp_path: Path, bl: Any) -> None:
    out = tmp_path / "profile.json"
    result = bl.run("calibrate", *_failing_launch(tmp_path), "--out", str(out))
    assert result.returncode == 2, result.stderr
    assert "exited with code 3 before it was ready" in result.stderr
    said = _everything(result, tmp_path / "profile.calibration")
    assert [s for s in LAUNCH_SECRETS if s in said] == []


def test_engine_session_scrubs_the_start_error_it_raises(tmp_path: Path) -> None:
    """Every caller of engine_session (validate, calibrate, run_live) gets the error
    scrubbed of the plan's secrets, whatever it then prints."""
    plan = LaunchPlan(engine="fake", launch=True,
                      argv=(str(_fake_engine(tmp_path)), "--api-key", "sk-SESSIONKEY-1"),
                      env={"HF_TOKEN": "hfSESSIONTOKEN2"}, base_url="http://127.0.0.1:9",
                      health_path="/health")
    spec = TargetSpec("fake", "launch", ready_timeout_s=60)
    with pytest.raises(EngineStartError) as caught, \
            engine_session(spec, tmp_path / "logs", plan=plan):
        pass
    said = str(caught.value)
    assert "exited with code 3" in said and "HF_TOKEN=***" in said
    assert "sk-SESSIONKEY-1" not in said and "hfSESSIONTOKEN2" not in said


# ---------------------------------------------------------------- 2. URL credentials, stored


def test_url_credentials_are_masked_in_argv_records_and_text() -> None:
    command = ["batchlab", "replay", "--target", "http://bob:pw-1@h:8000",
               "--url=https://alice:p@ss@h/v1", "--extra-arg=--hub=https://tok3n@hub"]
    assert redact_argv(command) == ["batchlab", "replay", "--target", "http://***@h:8000",
                                    "--url=https://***@h/v1", "--extra-arg=--hub=https://***@hub"]
    record = {"config": {"target_url": "http://u:pw@h:1"}, "notes": ["at http://u:pw@h/x ok"],
              "command": ["b", "--url", "http://u:pw@h"], "base_url": "http://h:1", "n": 3}
    assert redact_tree(record) == {
        "config": {"target_url": "http://***@h:1"}, "notes": ["at http://***@h/x ok"],
        "command": ["b", "--url", "http://***@h"], "base_url": "http://h:1", "n": 3}
    assert scrub_text("no ready server at http://u:pw@h:1 (e-mail a@b.c)", []) == \
        "no ready server at http://***@h:1 (e-mail a@b.c)"
    # the adapters' own copy of the rule (adapters import no harness) agrees
    for text in ("http://u:pw@h:1/x", "'https://t@h'", "x http://h/a@b", "http://u:p@ss@h"):
        assert shown_url(text) == redact_url(text)


def test_replay_keeps_url_credentials_out_of_its_run_folder(tmp_path: Path, loopback: str,
                                                            bl: Any) -> None:
    """Issue case: manifest.json (command, target_url, base_url) and report.md's "Run it
    again" held ``http://user:pass@host``; a second run into the folder is still the same run."""
    target = loopback.replace("://", f"://bob:{URL_PASSWORD}@")
    out = tmp_path / "run"
    args = ("replay", "--target", target, *bl.SMALL_TRACE, "--out", str(out))
    first = bl.run(*args)
    assert first.returncode == 0, first.stderr
    again = bl.run(*args)  # the manifest says http://***@host: the same target
    assert again.returncode == 0, again.stderr
    report = bl.run("report", str(out))
    assert report.returncode == 0, report.stderr
    manifest = bl.read_json(out / "manifest.json")
    assert manifest["replay"]["target_url"].startswith("http://***@127.0.0.1:")
    for result in (first, again, report):
        assert URL_PASSWORD not in _everything(result, out)


def test_run_identity_is_kept_and_shown_without_credentials() -> None:
    one = RunIdentity("live", "d", target="http://u:pw@h:1")
    assert one == RunIdentity("live", "d", target="http://***@h:1")
    assert "pw" not in one.describe() and one.as_dict()["target"] == "http://***@h:1"


def test_scenario_url_stays_out_of_the_scenario_folder(tmp_path: Path, loopback: str,
                                                       bl: Any) -> None:
    url = loopback.replace("://", f"://alice:{URL_PASSWORD}@")
    scenario = tmp_path / "attached.yaml"
    scenario.write_text(textwrap.dedent(f"""\
        name: attached
        question: Does an attached server's password stay out of the scenario's files?
        trace: {{path: azure_conv_excerpt.csv, limit: 2}}
        model: llama-3.1-8b
        gpu: h100-sxm
        engines:
          - name: there
            engine: openai
            url: {url}
            served_model_name: llama-3.1-8b
    """))
    result = bl.run("run", str(scenario), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stdout + result.stderr
    folder = tmp_path / "out" / "attached"
    assert (folder / "there" / "cell.json").exists()
    assert URL_PASSWORD not in _everything(result, folder)


# ---------------------------------------------------------------- 3. URL credentials, shown


def test_url_passwords_are_secret_values(tmp_path: Path) -> None:
    secrets = secret_values(argv=["batchlab", "--target", "http://bob:pw%40word1@h"],
                            urls=["https://carol:s3cretpass@h:1", None, "http://h:2"])
    assert secrets == {"pw%40word1", "pw@word1", "s3cretpass"}
    log = tmp_path / "server.log"
    log.write_text("auth with s3cretpass for carol\n")
    assert scrub_files(tmp_path, secrets) == 1
    assert log.read_text() == f"auth with {MASK} for carol\n"


def test_attach_that_gets_no_answer_does_not_print_the_password(tmp_path: Path) -> None:
    with pytest.raises(EngineStartError) as caught:
        asyncio.run(wait_healthy(URL + "/health", timeout_s=0.0, timeout_note="not ready"))
    assert URL_PASSWORD not in str(caught.value) and "http://***@127.0.0.1:9" in str(caught.value)
    spec = TargetSpec("openai", "attach", url=URL, model="m", ready_timeout_s=0.1)
    with pytest.raises(EngineStartError) as caught, engine_session(spec, tmp_path):
        pass
    assert str(caught.value).startswith("no ready server at http://***@127.0.0.1:9 after")
    assert URL_PASSWORD not in str(caught.value)


def test_replay_messages_do_not_print_the_password(tmp_path: Path, bl: Any) -> None:
    """Issue cases: "is the server at http://u:PW@... up?", "no ready server at
    http://bob:PW@...", the --dry-run "url:" line."""
    target = bl.run("replay", "--target", URL, *bl.SMALL_TRACE, "--out", str(tmp_path / "t"))
    assert "is the server at http://***@127.0.0.1:9 up?" in target.stderr
    attach = bl.run("replay", "--engine", "openai", "--url", URL, *bl.SMALL_TRACE,
                    "--ready-timeout-s", "0.5", "--out", str(tmp_path / "a"))
    assert "no ready server at http://***@127.0.0.1:9" in attach.stderr
    dry = bl.run("replay", "--engine", "openai", "--url", URL, *bl.SMALL_TRACE, "--dry-run",
                 "--out", str(tmp_path / "d"))
    assert "url: http://***@127.0.0.1:9" in dry.stdout, dry.stderr
    for result in (target, attach, dry):
        assert URL_PASSWORD not in _everything(result, tmp_path)


def test_prompt_cache_warning_does_not_print_the_password(monkeypatch) -> None:
    from harness.live import prompts

    monkeypatch.setattr(prompts, "prompt_cache_hint", lambda url: "llama.cpp caches prompts")
    warning = prompts.prompt_cache_warning(URL, "")
    assert warning is not None and warning.startswith("warning: http://***@127.0.0.1:9 may")
    assert URL_PASSWORD not in warning


# ---------------------------------------------------------------- 4. several --api-key values


def test_every_value_of_a_several_valued_secret_flag_is_masked() -> None:
    command = ["batchlab", "replay", "--extra-arg=--api-key", "--extra-arg=sk-FIRST1",
               "--extra-arg=sk-SECOND2", "--extra-arg=--dtype", "--extra-arg=float32"]
    assert redact_argv(command) == [
        "batchlab", "replay", "--extra-arg=--api-key", f"--extra-arg={MASK}",
        f"--extra-arg={MASK}", "--extra-arg=--dtype", "--extra-arg=float32"]
    engine = ["vllm", "serve", "--api-key", "k-one-1", "k-two-2", "--port", "8000"]
    assert redact_argv(engine) == ["vllm", "serve", "--api-key", MASK, MASK, "--port", "8000"]
    assert secret_values(argv=engine) == {"k-one-1", "k-two-2"}
    # a flag that takes one value still masks only it
    assert redact_argv(["x", "--hf-token", "a1", "pos"]) == ["x", "--hf-token", MASK, "pos"]


# ---------------------------------------------------------------- 5. secrets of digits


def test_long_secrets_of_digits_are_scrubbed_short_numbers_are_not() -> None:
    secrets = secret_values(env={"MY_AUTH": "98765432109876", "PORT_ISH": "8000",
                                 "FLAG": "true", "SHORT": "1234567"})
    assert secrets == {"98765432109876"}  # 8 characters or more: scrubbed whatever they are
    said = scrub_text("401: key 98765432109876 refused; port 8000, 1234567 ok, true", secrets)
    assert said == f"401: key {MASK} refused; port 8000, 1234567 ok, true"


def test_an_api_key_of_digits_is_scrubbed_from_an_error_body(monkeypatch) -> None:
    monkeypatch.setenv("BL_DIGIT_KEY", "8675309123456789")
    secrets = secret_values(api_key_env="BL_DIGIT_KEY")
    assert scrub_text("HTTP 401: bad key '8675309123456789'", secrets) == \
        f"HTTP 401: bad key '{MASK}'"


# ---------------------------------------------------------------- 6. malformed --engine-env


@pytest.mark.parametrize(("items", "said"), [
    (("=hfBADSECRET3",), "--engine-env (the 1st one): expected KEY=VALUE, nothing before"),
    (("A=1", "HF_TOKENhfBADSECRET1"), "--engine-env (the 2nd one): expected KEY=VALUE, no '='"),
])
def test_a_malformed_engine_env_is_named_by_place_not_text(tmp_path: Path, bl: Any,
                                                            items: tuple[str, ...],
                                                            said: str) -> None:
    flags = [a for item in items for a in ("--engine-env", item)]
    result = bl.run("replay", "--engine", "vllm", "--launch", *bl.SMALL_TRACE, *flags,
                    "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert said in result.stderr
    assert "BADSECRET" not in result.stdout + result.stderr


# ---------------------------------------------------------------- 7. URL without //, a key for VAR


def test_a_url_without_slashes_does_not_print_its_password() -> None:
    for url in ("u:PWnoslash9@127.0.0.1:8000", "http:/u:PWnoslash9@h", "sk-user:PWnoslash9@h"):
        why = target_url_problem(url, "--target")
        assert why is not None and "PWnoslash9" not in why and "***@" in why
        assert "sk-user" not in why  # read as a scheme, it is still not repeated


def test_a_key_given_for_the_variable_name_is_refused_unrepeated(tmp_path: Path,
                                                                bl: Any) -> None:
    key = "sk-LITERALKEY-777abc"
    assert not env_var_name(key) and env_var_name("MY_KEY_2") and not env_var_name("2KEY")
    with pytest.raises(ValueError) as caught:
        ReplayConfig(target_url="http://127.0.0.1:9", api_key_env=key).validate()
    assert "api_key_env: expected the NAME" in str(caught.value) and key not in str(caught.value)
    replay = bl.run("replay", "--target", "http://127.0.0.1:9", *bl.SMALL_TRACE,
                    "--api-key-env", key, "--out", str(tmp_path / "run"))
    serve = bl.run("serve", "reference", "--api-key-env", key, "--port", "0")
    for result in (replay, serve):
        assert result.returncode == 2 and "--api-key-env" not in result.stdout
        assert "expected the NAME" in result.stderr and key not in result.stderr
    # where an argv is stored, a key in place of VAR is masked; a name is kept
    assert redact_argv(["b", "--api-key-env", key, "--api-key-env=MY_VAR"]) == [
        "b", "--api-key-env", MASK, "--api-key-env=MY_VAR"]



# ---------------------------------------------------------------- 2 and 3: the other writers


def test_calibrate_keeps_url_credentials_out_of_its_profile(tmp_path: Path, loopback: str,
                                                           bl: Any) -> None:
    """The profile's ``metadata.engine.base_url`` and the "calibrating ... at URL" line."""
    url = loopback.replace("://", f"://dave:{URL_PASSWORD}@")
    out = tmp_path / "profile.json"
    result = bl.run("calibrate", "--engine", "openai", "--url", url, "--model", "llama-3.1-8b",
                    "--max-num-seqs", "2", "--max-num-batched-tokens", "256",
                    "--max-model-len", "256", "--output-tokens", "8", "--max-batch-size", "2",
                    "--long-prompt-tokens", "64", "--gpu", "cpu", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "at http://***@127.0.0.1:" in result.stdout
    engine = bl.read_json(out)["metadata"]["engine"]
    assert engine["base_url"].startswith("http://***@127.0.0.1:")
    assert URL_PASSWORD not in _everything(result, tmp_path)


def test_validate_names_a_server_gone_without_its_credentials(
        tmp_path: Path, loopback: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """fidelity.json records the base URL, the knobs (extra_args) and "the engine at URL
    stopped answering" as a manifest would: redacted."""
    from harness import validate
    from harness.cli import main

    monkeypatch.setattr(validate, "engine_answers", lambda plan, timeout_s=5.0: False)
    url = loopback.replace("://", f"://erin:{URL_PASSWORD}@")
    out = tmp_path / "validate"
    # the published profiles name their engine in words: one as calibrate writes it
    profile = json.loads(Path(PROFILE).read_text())
    profile["metadata"]["engine"] = {"name": "vllm"}
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    code = main(["validate", "--engine", "openai", "--url", url, "--model", "llama-3.1-8b",
                 "--profile", str(tmp_path / "profile.json"), "--trace", TRACE, "--limit", "2",
                 "--max-num-seqs", "4", "--extra-arg=--api-key", "--extra-arg=sk-VALKEY-1234",
                 "--out", str(out)])
    said = capsys.readouterr()
    assert code == 0, said.err  # every request completed: the speed probe after it failed
    fidelity = (out / "fidelity.json").read_text()
    assert "the engine at http://***@127.0.0.1:" in fidelity
    files = [p.read_bytes().decode(errors="replace") for p in out.rglob("*") if p.is_file()]
    everything = "\n".join([said.out, said.err, *files])
    assert URL_PASSWORD not in everything and "sk-VALKEY-1234" not in everything


def test_a_server_gone_is_named_without_its_credentials(tmp_path: Path) -> None:
    """A replay's and a sweep's ``gone_mid_run``, a capacity probe's ``server_lost``."""
    from harness.capacity.probe import ProbePlan, server_lost
    from harness.metrics import Slo
    from harness.scenario.attached import gone_mid_run

    summary = {"num_requests": 3, "num_completed": 1, "num_failed": 2,
               "failures": {"connect_error": 2}}
    why = gone_mid_run(URL, summary)
    assert why is not None and why.startswith("the server at http://***@127.0.0.1:9 stopped")
    spec = TargetSpec("openai", "attach", url=URL, model="m")
    plan = ProbePlan(spec=spec, trace_at=lambda kind, load: None,  # type: ignore[arg-type,return-value]
                     slo=Slo(ttft_s=1.0), kind="rate", target=0.9, cell={}, digest="d")
    lost = server_lost(plan, 1.0, summary, tmp_path)
    assert lost is not None and "the server at http://***@127.0.0.1:9" in lost
    assert URL_PASSWORD not in why + lost
