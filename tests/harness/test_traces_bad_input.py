"""Trace input that used to escape as a traceback, be misread or be reported short: each case
now loads, or fails in one line naming the file, the line and the field, and
``--skip-bad-rows`` skips it and lists it.

Cases from a review of the loaders: unsigned 64-bit Mooncake hash ids, JSON numbers and
nesting past Python's limits, line separators inside JSON strings, every skipped row in the
note, BurstGPT failed rows with bad fields, CSV fields over csv's size limit, bounds on
--time-scale and on datetime spans, all fractional digits with a time zone, and the wording
for a forced format, a non-UTF-8 byte and a repeated column; a key repeated in a JSON row, and
a --time-scale that stretches a trace past the bound on its span.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.traces import (
    DATA_DIR,
    MAX_TIME_SCALE,
    MIN_TIME_SCALE,
    Trace,
    TraceError,
    TraceOptions,
    load_trace,
)

AZURE_CONV = DATA_DIR / "azure_conv_excerpt.csv"
MOONCAKE = DATA_DIR / "mooncake_conversation_excerpt.jsonl"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
GOOD_JSON_ROW = '{"timestamp": 1000, "input_length": 10, "output_length": 5}'


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def jsonl_row(**fields: object) -> str:
    return json.dumps({"timestamp": 0, "input_length": 10, "output_length": 5, **fields})


def loaded(path: Path, **options: object) -> Trace:
    trace = load_trace(path, TraceOptions(**options))  # type: ignore[arg-type]
    trace.check_invariants()
    return trace


def refused(path: Path, **options: object) -> str:
    with pytest.raises(TraceError) as info:
        load_trace(path, TraceOptions(**options))  # type: ignore[arg-type]
    return str(info.value)


# ---------------------------------------------------------------- 64-bit hash ids


def test_unsigned_64_bit_hash_ids_load_and_stay_apart(tmp_path: Path) -> None:
    big = write(tmp_path, "u64.jsonl", jsonl_row(hash_ids=[2**63]) + "\n"
                + jsonl_row(timestamp=5, hash_ids=[2**64 - 1]) + "\n")
    trace = loaded(big)
    assert [r.prefix_hash_ids for r in trace.requests] == [(2**63,), (2**64 - 1,)]
    # ids are identifiers: a different id is a different trace
    other = write(tmp_path, "u64b.jsonl", jsonl_row(hash_ids=[2**63 + 1]) + "\n"
                  + jsonl_row(timestamp=5, hash_ids=[2**64 - 1]) + "\n")
    assert loaded(other).digest != trace.digest
    # ... and a 64-bit id is not its int64 twin (2**64 - 1 is -1 as int64)
    same_bits = write(tmp_path, "twin.jsonl", jsonl_row(hash_ids=[2**63]) + "\n"
                      + jsonl_row(timestamp=5, hash_ids=[1]) + "\n")
    assert loaded(same_bits).digest != trace.digest


def test_hash_ids_below_2_63_keep_their_digest() -> None:
    # the digest of the shipped Mooncake excerpt, as it was before unsigned ids were read
    assert loaded(MOONCAKE).digest == (
        "8de983b2fbb1a2c9f617d01d324cee3d32737a19d47fd10f64485dfe3cdb37c4")


def test_cli_reads_unsigned_64_bit_hash_ids(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "u64.jsonl", jsonl_row(hash_ids=[9223372036854775808]) + "\n")
    assert main(["trace", "info", "--trace", str(path)]) == 0
    assert "1 requests carry prefix-block hashes" in capsys.readouterr().out


def test_hash_ids_past_64_bits_name_file_line_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, "u65.jsonl", GOOD_JSON_ROW + "\n"
                 + jsonl_row(hash_ids=[1, 2**64]) + "\n")
    assert refused(path) == (
        f"{path}:2: field 'hash_ids': expected a list of non-negative integers below 2**64 "
        "(64-bit hash ids), got 18446744073709551616 at index 1")
    trace = loaded(path, skip_bad_rows=True)
    assert len(trace) == 1 and trace.counts["skipped_bad_rows"] == 1


# ---------------------------------------------------------------- JSON past Python's limits


@pytest.mark.parametrize("bad_row, field, reason", [
    ('{"timestamp": 1' + "0" * 400 + ', "input_length": 10, "output_length": 5}', "timestamp",
     "expected at most 1e+10 seconds, got 1000000000000000000000000000000000000000... "
     "(401 characters)"),
    ('{"timestamp": 1' + "0" * 5000 + ', "input_length": 10, "output_length": 5}', "timestamp",
     "invalid JSON: an integer longer than 4300 digits"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 5, "x": '
     + "[" * 100_000 + "]" * 100_000 + "}", None,
     "invalid JSON: arrays or objects nested too deeply"),
])
def test_json_past_pythons_limits_is_a_row_error(
        tmp_path: Path, bad_row: str, field: str | None, reason: str) -> None:
    path = write(tmp_path, "t.jsonl", GOOD_JSON_ROW + "\n" + bad_row + "\n"
                 + GOOD_JSON_ROW + "\n")
    named = f"field {field!r}: " if field else ""
    assert refused(path) == f"{path}:2: {named}{reason}"
    trace = loaded(path, skip_bad_rows=True)
    assert len(trace) == 2 and trace.counts["skipped_bad_rows"] == 1
    named = f", field {field!r}" if field else ""
    assert trace.notes[0].endswith(f"(--skip-bad-rows): line 2{named}: {reason}")


def test_cli_json_past_pythons_limits_is_a_one_line_user_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "t.jsonl", '{"timestamp": 1' + "0" * 400
                 + ', "input_length": 10, "output_length": 5}\n')
    assert main(["trace", "info", "--trace", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert f"error: {path}:1: field 'timestamp': expected at most 1e+10 seconds" in err


# ---------------------------------------------------------------- keys repeated in a JSON row


@pytest.mark.parametrize("bad_row, key, times, values", [
    ('{"timestamp": 0, "input_length": 10, "input_length": 900, "output_length": 5, '
     '"hash_ids": [1]}', "input_length", 2, "10, 900"),
    ('{"timestamp": 0, "timestamp": 1000, "timestamp": 2000, "timestamp": 3000, '
     '"input_length": 10, "output_length": 5}', "timestamp", 4, "0, 1000, 2000, ..."),
    ('{"timestamp": 0, "input_length": 10, "output_length": 5, "note": "a", "note": "b"}',
     "note", 2, "'a', 'b'"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 5, '
     '"meta": {"turn": {"id": 1, "id": 2}}}', "id", 2, "1, 2"),
])
def test_a_key_repeated_in_a_json_row_is_a_row_error(
        tmp_path: Path, bad_row: str, key: str, times: int, values: str) -> None:
    """json keeps a repeated key's last value: a row that gave input_length twice loaded
    silently with one of them, the other lost. Every object of the row is checked, as every
    other fault of its JSON is (nesting too deep, an integer too long)."""
    path = write(tmp_path, "t.jsonl", GOOD_JSON_ROW + "\n" + bad_row + "\n"
                 + GOOD_JSON_ROW + "\n")
    reason = (f"appears {times} times in one JSON object of the row (values {values}): "
              "remove all but one")
    assert refused(path) == f"{path}:2: field {key!r}: {reason}"
    trace = loaded(path, skip_bad_rows=True)
    assert len(trace) == 2 and trace.counts["skipped_bad_rows"] == 1
    assert trace.notes[0].endswith(f"(--skip-bad-rows): line 2, field {key!r}: {reason}")


def test_cli_a_key_repeated_in_a_json_row_is_a_one_line_user_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "t.jsonl", '{"timestamp": 0, "input_length": 10, "input_length": '
                 '900, "output_length": 5, "hash_ids": [1]}\n')
    assert main(["trace", "info", "--trace", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert f"error: {path}:1: field 'input_length': appears 2 times" in err


def test_json_rows_with_distinct_keys_still_load(tmp_path: Path) -> None:
    path = write(tmp_path, "t.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": '
                 '5, "meta": {"id": 1, "turn": {"id": 2}}, "other": {"id": 3}}\n'
                 + '\ufeff' + GOOD_JSON_ROW + "\n")
    # a byte-order mark at the start of a later line is still named as json names it
    assert refused(path) == (f"{path}:2: invalid JSON: Unexpected UTF-8 BOM (decode using "
                             "utf-8-sig) (column 1)")
    trace = loaded(path, skip_bad_rows=True)
    assert len(trace) == 1 and trace.requests[0].num_prompt_tokens == 10


# ---------------------------------------------------------------- JSON lines end at \n


@pytest.mark.parametrize("inside", ["\u2028", "\u2029", "\u0085", "\x0c", "\x1c"])
def test_line_separators_inside_json_strings_are_text(tmp_path: Path, inside: str) -> None:
    path = write(tmp_path, "t.jsonl",
                 f'{{"timestamp": 0, "input_length": 10, "output_length": 5, "note": '
                 f'"a{inside}b"}}\n'
                 + jsonl_row(timestamp=5) + "\n"
                 + '{"timestamp": 9, "input_length": "x", "output_length": 5}\n')
    assert refused(path).startswith(f"{path}:3: field 'input_length'")  # not line 4
    trace = loaded(path, skip_bad_rows=True)
    assert len(trace) == 2 and trace.counts["skipped_bad_rows"] == 1


def test_crlf_json_lines_are_read(tmp_path: Path) -> None:
    path = write(tmp_path, "t.jsonl", jsonl_row() + "\r\n" + jsonl_row(timestamp=5) + "\r\n")
    assert [r.arrival_s for r in loaded(path).requests] == [0.0, 0.005]


# ---------------------------------------------------------------- every skipped row listed


def _azure_with_bad_rows(tmp_path: Path, bad_lines: list[int]) -> Path:
    lines = AZURE_CONV.read_text().splitlines(keepends=True)[:61]
    for n in bad_lines:
        stamp = lines[n - 1].split(",")[0]
        lines[n - 1] = f"{stamp},bad{n},44\n"
    return write(tmp_path, "bad.csv", "".join(lines))


def test_skip_bad_rows_lists_every_skipped_row(tmp_path: Path) -> None:
    path = _azure_with_bad_rows(tmp_path, [5, 19, 27, 31, 43])
    trace = loaded(path, skip_bad_rows=True)
    assert trace.counts["skipped_bad_rows"] == 5
    assert trace.notes[0] == (
        f"skipped 5 malformed rows of {path} (--skip-bad-rows): "
        + "; ".join(f"line {n}, field 'ContextTokens': expected a non-negative integer, "
                    f"got 'bad{n}'" for n in (5, 19, 27, 31, 43)))


def test_skip_bad_rows_lists_the_first_ten_and_counts_the_rest(tmp_path: Path) -> None:
    bad = list(range(3, 33, 2))  # 15 rows
    trace = loaded(_azure_with_bad_rows(tmp_path, bad), skip_bad_rows=True)
    note = trace.notes[0]
    assert note.startswith("skipped 15 malformed rows of ")
    assert note.endswith("line 21, field 'ContextTokens': expected a non-negative integer, "
                         "got 'bad21'; and 5 more")
    assert "line 23," not in note


def test_cli_trace_info_lists_every_skipped_row(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = _azure_with_bad_rows(tmp_path, [5, 19, 27, 31, 43])
    assert main(["trace", "info", "--trace", str(path), "--skip-bad-rows"]) == 0
    out = capsys.readouterr().out
    assert "skipped_bad_rows 5" in out
    for n in (5, 19, 27, 31, 43):
        assert f"line {n}, field 'ContextTokens'" in out


# ---------------------------------------------------------------- BurstGPT failed rows


def test_a_burstgpt_failed_row_with_a_bad_field_is_a_bad_row(tmp_path: Path) -> None:
    path = write(tmp_path, "b.csv", BURSTGPT_HEADER
                 + "0,ChatGPT,abc,0,0,Conversation log\n"
                 + "1,ChatGPT,10,0,10,Conversation log\n"  # failed, well formed: dropped
                 + "2,ChatGPT,10,5,15,Conversation log\n")
    assert refused(path) == (f"{path}:2: field 'Request tokens': expected a non-negative "
                             "integer, got 'abc'")
    trace = loaded(path, skip_bad_rows=True)
    assert trace.counts["skipped_bad_rows"] == 1
    assert trace.counts["dropped_failed"] == 1
    assert len(trace) == 1


# ---------------------------------------------------------------- wide CSV fields


def test_an_ignored_column_past_csvs_field_limit_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, "wide.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,Text\n"
                 + "2023-11-16 18:15:46.0,10,5," + "x" * 200_000 + "\n"
                 + "2023-11-16 18:15:47.0,11,6,short\n")
    trace = loaded(path)
    assert [r.num_prompt_tokens for r in trace.requests] == [10, 11]


def test_a_quote_left_open_before_200000_characters_still_names_its_line(
        tmp_path: Path) -> None:
    rows = "".join(f"2023-11-16 18:15:{i % 60:02d}.0,10,5\n" for i in range(8000))
    path = write(tmp_path, "open.csv", AZURE_HEADER + '2023-11-16 18:15:46.0,"37,5\n' + rows)
    assert refused(path, skip_bad_rows=True).startswith(
        f"{path}:2: an opening quote on this line is not closed")


# ---------------------------------------------------------------- bounds on time


@pytest.mark.parametrize("scale", [1e300, 1e-300, MAX_TIME_SCALE * 2, MIN_TIME_SCALE / 2,
                                   float("inf")])
def test_time_scale_past_its_bounds_names_the_flag(
        scale: float, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(TraceError) as info:
        TraceOptions(time_scale=scale)
    assert str(info.value) == (
        f"--time-scale: expected a factor between 1e-06 and 1e+06, got {scale!r}")
    assert main(["trace", "info", "--trace", str(AZURE_CONV), "--time-scale", str(scale)]) == 2
    assert "--time-scale: expected a factor between 1e-06 and 1e+06" in capsys.readouterr().err


def test_time_scale_at_its_bounds_is_accepted() -> None:
    for scale in (MIN_TIME_SCALE, MAX_TIME_SCALE):
        trace = loaded(AZURE_CONV, limit=3, time_scale=scale)
        assert trace.requests[1].arrival_s > 0


def test_datetimes_further_apart_than_the_timestamp_bound_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "d.csv", AZURE_HEADER + "2023-11-16 18:15:46.0,10,5\n"
                 + "0001-01-01 00:00:00,10,5\n" + "9999-12-31 00:00:00,10,5\n"
                 + "2023-11-16 18:15:47.0,10,5\n")
    assert refused(path) == (
        f"{path}:3: field 'TIMESTAMP': expected timestamps at most 1e+10 seconds apart, got "
        "'0001-01-01 00:00:00', 6.38e+10 s before line 2's")
    trace = loaded(path, skip_bad_rows=True)
    assert [r.arrival_s for r in trace.requests] == [0.0, 1.0]
    assert "line 4, field 'TIMESTAMP': expected timestamps at most 1e+10 seconds apart" \
        in trace.notes[0]


def _long_trace(tmp_path: Path, span_s: float) -> Path:
    """Two Mooncake rows ``span_s`` seconds apart (its timestamps are milliseconds)."""
    return write(tmp_path, "long.jsonl", jsonl_row() + "\n"
                 + jsonl_row(timestamp=span_s * 1000) + "\n")


def test_time_scale_times_a_long_span_past_the_span_bound_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--time-scale and a trace's span were each bounded, but not their product: a span of
    1e6 s at --time-scale 1e6 reached the run as 1e12 s (31,700 years) of arrivals."""
    path = _long_trace(tmp_path, 1e6)
    assert refused(path, time_scale=MAX_TIME_SCALE) == (
        f"{path}: --time-scale 1e+06 stretches the trace's span of 1e+06 s to 1e+12 s; "
        "expected a span of at most 1e+10 seconds, the bound on a trace's timestamps (a "
        "smaller --time-scale, or --end-s, shortens it)")
    assert main(["trace", "info", "--trace", str(path), "--time-scale", "1e6"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "stretches the trace's span of 1e+06 s to 1e+12 s" in err
    # up to the bound, and a window that shortens the span, are accepted
    assert loaded(path, time_scale=1e4).duration_s == 1e10
    assert loaded(path, time_scale=MAX_TIME_SCALE, end_s=1e4).duration_s == 0.0
    assert loaded(path, time_scale=MIN_TIME_SCALE).duration_s == pytest.approx(1.0)


def test_a_rate_that_spreads_arrivals_past_the_span_bound_is_refused(tmp_path: Path) -> None:
    """--rate is bounded alone too: 20,001 requests at 1e-6 req/s reached the run as 2e10 s
    of arrivals, rescaled or synthesized."""
    path = write(tmp_path, "many.jsonl",
                 "".join(jsonl_row(timestamp=i) + "\n" for i in range(20_001)))
    assert refused(path, rate=1e-6) == (
        f"{path}: --rate 1e-06 spreads the trace's arrivals (20,001 requests) over 2e+10 s; "
        "expected a span of at most 1e+10 seconds, the bound on a trace's timestamps (a "
        "higher --rate, or --limit, shortens it)")
    said = refused(path, rate=1e-6, arrival="poisson")
    assert said.startswith(f"{path}: --rate 1e-06 spreads synthetic arrivals (20,001 "
                           "requests) over ")
    assert loaded(path, rate=1e-6, limit=10_000).duration_s == pytest.approx(9.999e9)


def test_a_scenarios_time_scale_past_the_span_bound_names_its_key(tmp_path: Path) -> None:
    """The same product through a scenario's load.time_scales: refused when the cell's trace
    is loaded, in the scenario's words."""
    from harness.scenario import ScenarioError, load_cell_trace, load_scenario

    _long_trace(tmp_path, 1e6)
    path = write(tmp_path, "s.yaml", textwrap.dedent("""\
        name: long
        question: Does a long trace stretch too far?
        trace:
          path: long.jsonl
        model: llama-3.1-8b
        gpu: h100-sxm
        engines:
          - name: fcfs
            engine: reference
            knobs: {policy: fcfs, max_model_len: 8192}
        load: {time_scales: [1.0e+6]}
        """))
    scenario = load_scenario(path)
    with pytest.raises(ScenarioError) as err:
        load_cell_trace(scenario, scenario.cells()[0].load)
    assert ("time_scale 1e+06 stretches the trace's span of 1e+06 s to 1e+12 s; expected a "
            "span of at most 1e+10 seconds") in str(err.value)
    assert "--" not in str(err.value).split("trace:", 1)[1]


# ---------------------------------------------------------------- datetimes with zones


def test_all_fractional_digits_are_kept_with_a_time_zone(tmp_path: Path) -> None:
    path = write(tmp_path, "z.csv", AZURE_HEADER
                 + "2024-05-10 00:00:00.0000001+00:00,10,5\n"
                 + "2024-05-10 00:00:00.0000009+00:00,10,5\n"
                 + "2024-05-10T02:00:01.1234567+02:00,10,5\n"
                 + "2024-05-10 00:00:02.5Z,10,5\n")
    assert [r.arrival_s for r in loaded(path).requests] == pytest.approx(
        [0.0, 8e-7, 1.1234566, 2.4999999], abs=1e-12)


# ---------------------------------------------------------------- wording


def test_format_mooncake_on_a_csv_says_it_looks_like_csv(tmp_path: Path) -> None:
    message = refused(AZURE_CONV, format="mooncake", skip_bad_rows=True)
    assert message == (
        f"{AZURE_CONV}:1: invalid JSON: the file looks like CSV (azure header "
        "'TIMESTAMP,ContextTokens,GeneratedTokens'), not JSON lines: drop --format, or use "
        "--format azure")


def test_format_azure_on_json_lines_says_it_looks_like_json_lines() -> None:
    assert refused(MOONCAKE, format="azure") == (
        f"{MOONCAKE}: missing column(s) 'TIMESTAMP', 'ContextTokens', 'GeneratedTokens' for "
        "format 'azure'; the file looks like JSON lines (line 1 is a JSON object), not CSV: "
        "drop --format, or use --format mooncake")


def test_a_byte_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(AZURE_HEADER.encode() + b"2023-11-16 18:15:46.0,10,5\n"
                     + b"2023-11-16 18:15:47.0,10,5\xe9\n")
    assert refused(path) == (f"{path}:3: not UTF-8 text (byte 0xe9, column 27 of the line, "
                             "byte 93 of the file)")


def test_a_required_column_twice_in_the_header_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "dup.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n"
                 "2023-11-16 18:15:46.0,10,5,99\n")
    assert refused(path) == (f"{path}:1: column 'ContextTokens' appears 2 times in the header "
                             "(columns 2, 4): rename or remove all but one")


def test_on_too_long_without_a_length_is_refused_or_takes_the_simulated_engines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--on-too-long drop without --max-model-len was ignored: nothing dropped, and the long
    requests failed in the run. Refused where the engine's length is not known; simulate
    applies its engine's (the model's 131072 here), and says what it dropped."""
    with pytest.raises(TraceError, match=r"^--on-too-long: drop needs --max-model-len N"):
        TraceOptions(on_too_long="drop")
    trace = tmp_path / "long.jsonl"
    trace.write_text("".join(
        f'{{"timestamp": {i * 100}, "input_length": {n}, "output_length": 10}}\n'
        for i, n in enumerate((100, 200_000, 300))))
    assert main(["trace", "info", "--trace", str(trace), "--on-too-long", "clip"]) == 2
    assert "--on-too-long: clip needs --max-model-len N" in capsys.readouterr().err
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(trace), "--on-too-long", "drop", "--out", str(out),
                 "--no-report"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["trace"]["options"]["max_model_len"] == 131072
    assert "dropped 1 requests longer than max_model_len 131072" in manifest["trace"]["notes"]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["num_requests"], summary["num_failed"]) == (2, 0)


def test_a_capacity_search_of_the_simulated_engine_takes_its_length_for_on_too_long(
        tmp_path: Path) -> None:
    """capacity runs the same simulated engine as simulate: --on-too-long drop without
    --max-model-len was refused there while simulate applied the engine's length."""
    trace = tmp_path / "long.jsonl"
    trace.write_text("".join(
        f'{{"timestamp": {i}, "input_length": {n}, "output_length": 4}}\n'
        for i, n in enumerate([64] * 11 + [200_000])))
    out = tmp_path / "cap"
    assert main(["capacity", "--trace", str(trace), "--on-too-long", "drop", "--search",
                 "concurrency", "--slo", "tpot_s=1", "--start", "1", "--max-load", "2",
                 "--out", str(out)]) in (0, 1)
    search = json.loads(next(out.glob("*/search.json")).read_text())
    assert search["made_from"]["options"]["max_model_len"] == 131072
