"""Server logs are scrubbed exactly as error messages are (one masking rule): the beginning of
a secret a server echoed is masked in the on-disk log too, and a log is read in chunks."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from harness import redact
from harness.redact import MASK, scrub_files, scrub_text

SECRET = "hf_secret123456"


def test_a_partial_secret_is_masked_in_the_log_as_in_the_message(tmp_path: Path) -> None:
    """Issue case: --engine-env HF_TOKEN=hf_secret123456 and a server echoing "half hf_secre":
    the error message showed "half ***", the stderr log kept "half hf_secre"."""
    log = tmp_path / "llamacpp-server.stderr.log"
    log.write_text("half hf_secre\nwhole hf_secret123456 here\nshort hf_se\n")
    assert scrub_files(tmp_path, [SECRET]) == 1
    assert log.read_text() == "half ***\nwhole *** here\nshort hf_se\n"
    assert log.read_text() == scrub_text("half hf_secre\nwhole hf_secret123456 here\n"
                                         "short hf_se\n", [SECRET])


def test_a_log_without_a_secret_is_left_as_it_is(tmp_path: Path) -> None:
    log = tmp_path / "server.stdout.log"
    log.write_text("nothing here: hf_se\n")
    before = log.stat().st_mtime_ns
    assert scrub_files(tmp_path, [SECRET]) == 0
    assert log.read_text() == "nothing here: hf_se\n" and log.stat().st_mtime_ns == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server.stdout.log"]


@pytest.mark.parametrize("chunk_size", [1, 2, 5, 7, 16, 64])
def test_chunked_reading_masks_what_reading_it_whole_masks(chunk_size: int) -> None:
    """A secret split across two reads is still found, whatever the boundary."""
    secrets = [SECRET, "zzz-auth-value", "sk-LEAKTEST-0123"]
    text = ("a hf_secre b hf_secret123456hf_secret123456 c zzz-auth d sk-LEAKTEST-01 e "
            "hf_sec f hf_se g " * 3)
    src, dst = io.BytesIO(text.encode()), io.BytesIO()
    pattern = redact._mask_pattern([s.encode() for s in secrets])
    assert pattern is not None
    changed = redact._scrub_stream(src, dst, pattern, max(map(len, secrets)),
                                   chunk_size=chunk_size)
    assert changed and dst.getvalue().decode() == scrub_text(text, secrets)
    assert dst.getvalue().decode().startswith(f"a {MASK} b {MASK}{MASK} c {MASK} d {MASK} e "
                                              f"{MASK} f hf_se g ")


def test_a_big_log_is_scrubbed_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redact, "_SCRUB_CHUNK", 10)  # many reads, a secret across each border
    log = tmp_path / "big.log"
    body = "".join(f"line {i} half hf_secre{i}\n" for i in range(300))
    log.write_text(body)
    assert scrub_files(tmp_path, [SECRET]) == 1
    assert log.read_text() == scrub_text(body, [SECRET])
    assert "hf_sec" not in log.read_text()


def test_a_long_secret_and_a_long_beginning_of_it_are_masked_with_one_kept_masker() -> None:
    """A 5,000-character secret (a JWT is thousands) is masked whole and as its 3,000-character
    beginning, as a short one is; the masker is made once per set of secrets and reused by
    every later message of a replay, not made again for each."""
    secret = "".join(f"{i:04d}" for i in range(1250))  # 5,000 characters, no repeats of 6
    text = f"echo {secret} cut '{secret[:3000]}' short {secret[:5]}"
    first = redact._mask_pattern([secret])
    assert scrub_text(text, [secret]) == f"echo {MASK} cut '{MASK}' short {secret[:5]}"
    assert redact._mask_pattern([secret]) is first
    hits = redact._masker.cache_info().hits
    assert scrub_text(text, {secret}) == f"echo {MASK} cut '{MASK}' short {secret[:5]}"
    assert redact._masker.cache_info().hits == hits + 1


def _masked_by_every_beginning(text: str, secrets: list[str]) -> str:
    """The rule as first written: one regex alternative for each secret and each beginning of
    it of MIN_CUT_SECRET characters or more, longest first."""
    import re

    cuts = {s[:k] for s in secrets for k in range(redact.MIN_CUT_SECRET, len(s))} | set(secrets)
    ordered = sorted(cuts, key=lambda c: (-len(c), c))
    return re.compile("|".join(map(re.escape, ordered))).sub(MASK, text)


def test_the_masker_masks_what_every_beginning_as_a_pattern_masks() -> None:
    """Secrets sharing a head, secrets inside others, short ones, a secret's beginning followed
    by another secret: the longest agreeing run at each place, left to right."""
    import random

    rng = random.Random(7)
    for _ in range(300):
        secrets = ["".join(rng.choice("ab") for _ in range(rng.randint(3, 14)))
                   for _ in range(rng.randint(1, 4))]
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 60)))
        assert scrub_text(text, secrets) == _masked_by_every_beginning(text, secrets), (
            text, secrets)
