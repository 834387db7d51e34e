"""Secret flags whose names hide the secret word: a compound (TGI's ``--ngrok-authtoken``,
launcher/src/main.rs ``ngrok_authtoken``) or a short alias (llama.cpp's ``-hft`` for
``--hf-token``, common/arg.cpp). Their values are masked wherever an argv is stored and
scrubbed from logs, while flags that only count tokens stay readable."""

from __future__ import annotations

import pytest

from harness.redact import MASK, redact_argv, redact_tree, secret_values

HF = "hf_HIDDENtoken123"
NGROK = "ngrokAUTH-4567890"


@pytest.mark.parametrize("flag", ["-hft", "--hft", "--ngrok-authtoken", "--ngrok_authtoken",
                                  "--apikey", "--hf-accesstoken", "--adminpassword"])
def test_a_secret_flag_hidden_in_a_compound_or_an_alias_is_masked(flag: str) -> None:
    assert redact_argv(["engine", flag, HF, "--port", "80"]) == [
        "engine", flag, MASK, "--port", "80"]
    assert redact_argv(["engine", f"{flag}={HF}"]) == ["engine", f"{flag}={MASK}"]
    assert secret_values(argv=["engine", flag, HF]) == {HF}


def test_llamacpp_hf_token_alias_is_masked() -> None:
    argv = ["llama-server", "-hft", HF, "-hf", "org/model-GGUF", "-c", "4096"]
    assert redact_argv(argv) == [
        "llama-server", "-hft", MASK, "-hf", "org/model-GGUF", "-c", "4096"]
    assert secret_values(argv=argv) == {HF}


def test_tgi_ngrok_authtoken_in_extra_args_is_masked() -> None:
    command = ["batchlab", "replay", "--engine", "tgi", "--extra-arg=--ngrok-authtoken",
               f"--extra-arg={NGROK}", "--extra-arg", "-hft", "--extra-arg", HF,
               "--extra-arg=--max-batch-total-tokens", "--extra-arg=4096"]
    assert redact_argv(command) == [
        "batchlab", "replay", "--engine", "tgi", "--extra-arg=--ngrok-authtoken",
        f"--extra-arg={MASK}", "--extra-arg", "-hft", "--extra-arg", MASK,
        "--extra-arg=--max-batch-total-tokens", "--extra-arg=4096"]
    assert secret_values(argv=command) == {NGROK, HF}


def test_records_mask_hidden_secret_flags_in_extra_args() -> None:
    record = {
        "engine": {"extra_args": ["-hft", HF, "--ngrok-authtoken", NGROK]},
        "mapping": [{"knob": "extra_args", "value": ["-hft", HF],
                     "flags": [f"-hft {HF}", f"--ngrok-authtoken={NGROK}"]}],
    }
    assert redact_tree(record) == {
        "engine": {"extra_args": ["-hft", MASK, "--ngrok-authtoken", MASK]},
        "mapping": [{"knob": "extra_args", "value": ["-hft", MASK],
                     "flags": ["-hft '***'", "'--ngrok-authtoken=***'"]}],
    }


# Token counts, a tokenizer's path, KV settings and llama.cpp's other -hf* aliases: no secret.
HARMLESS = [
    ("--max-batch-total-tokens", "4096"), ("--max-total-tokens", "2048"),
    ("--max-input-tokens", "2047"), ("--max-batch-prefill-tokens", "2048"),
    ("--max-num-batched-tokens", "512"), ("--max_num_tokens", "8192"),
    ("--tokenizer", "models/tok"), ("--tokenizer-config-path", "cfg.json"),
    ("--kv-cache-dtype", "fp8_e4m3fn"), ("-hf", "org/model-GGUF"), ("-hff", "model.gguf"),
]


@pytest.mark.parametrize(("flag", "value"), HARMLESS)
def test_flags_that_count_tokens_stay_visible(flag: str, value: str) -> None:
    argv = ["engine", flag, value, f"{flag}={value}"]
    assert redact_argv(argv) == argv
    assert redact_argv(["batchlab", f"--extra-arg={flag}", f"--extra-arg={value}"]) == [
        "batchlab", f"--extra-arg={flag}", f"--extra-arg={value}"]
    assert redact_tree({"extra_args": [flag, value]}) == {"extra_args": [flag, value]}
    assert secret_values(argv=argv) == frozenset()
