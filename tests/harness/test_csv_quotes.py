"""A quote left open in a CSV trace: the error names the line the quote opens on, and the row is
refused even with --skip-bad-rows, because csv reads every later line into that one field.

Issue case: line 22 of a 61-line Azure excerpt read `2023-11-16 18:16:30.1,"37`; the error
named line 61, and with --skip-bad-rows the load reported one skipped row while the 39 rows
after it were gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.traces import DATA_DIR, TraceError, TraceOptions, load_trace

AZURE_CONV = DATA_DIR / "azure_conv_excerpt.csv"
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _excerpt_with_line_22(tmp_path: Path, line: str) -> Path:
    lines = AZURE_CONV.read_text().splitlines(keepends=True)[:61]
    lines[21] = line + "\n"
    path = tmp_path / "bad.csv"
    path.write_text("".join(lines))
    return path


@pytest.mark.parametrize("skip_bad_rows", [False, True])
def test_a_quote_open_to_the_end_of_the_file_names_its_own_line(
        tmp_path: Path, skip_bad_rows: bool) -> None:
    path = _excerpt_with_line_22(tmp_path, '2023-11-16 18:16:30.1,"37')
    with pytest.raises(TraceError) as caught:
        load_trace(path, TraceOptions(skip_bad_rows=skip_bad_rows))
    assert caught.value.line == 22
    message = str(caught.value)
    assert message.startswith(f"{path}:22: an opening quote on this line is not closed")
    assert "lines 23 to 61, the end of the file" in message
    assert "refused even with --skip-bad-rows" in message


def test_a_quote_closed_lines_later_is_refused_too(tmp_path: Path) -> None:
    """csv takes a quote closed on a later line for one field spanning lines: that row would
    swallow the rows in between."""
    path = tmp_path / "closed.csv"
    path.write_text(HEADER + "2023-11-16 18:15:46.6805900,374,44\n"
                    + '2023-11-16 18:15:47.1,"37,2\n'
                    + "2023-11-16 18:15:48.6805900,374,44\n"
                    + '2023-11-16 18:15:49.1,3"7,2\n'
                    + "2023-11-16 18:15:50.6805900,374,44\n")
    with pytest.raises(TraceError, match=r"closed.csv:3: an opening quote on this line is not "
                                         r"closed \(lines 4 to 5 were read into one field"):
        load_trace(path, TraceOptions(skip_bad_rows=True))


def test_a_quote_open_on_the_last_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "last.csv"
    path.write_text(HEADER + "2023-11-16 18:15:46.6805900,374,44\n"
                    + '2023-11-16 18:15:47.1,"37,2')  # no newline at the end either
    with pytest.raises(TraceError, match=r"last.csv:3: an opening quote on this line is not "
                                         r"closed \(the file ends inside it\)"):
        load_trace(path, TraceOptions(skip_bad_rows=True))


def test_quotes_closed_on_their_line_are_plain_fields(tmp_path: Path) -> None:
    """Quoted fields are fine, and the other malformed rows are still skipped one by one, each
    named by its own line."""
    path = tmp_path / "ok.csv"
    path.write_text(HEADER + '"2023-11-16 18:15:46.6805900","374","44"\n'
                    + "2023-11-16 18:15:47.1,abc,2\n"
                    + '2023-11-16 18:15:48.1,"12",3\n'
                    + '"2023-11-16 18:15:49.1",5\n'
                    + "2023-11-16 18:15:50.1,7,8\n")
    with pytest.raises(TraceError, match=r"ok.csv:3: field 'ContextTokens'"):
        load_trace(path)
    trace = load_trace(path, TraceOptions(skip_bad_rows=True))
    assert [(r.num_prompt_tokens, r.num_output_tokens) for r in trace.requests] == [
        (374, 44), (12, 3), (7, 8)]
    assert trace.counts["skipped_bad_rows"] == 2
    assert trace.counts["num_source_rows"] == 5


def test_trace_info_says_so_in_one_line(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = _excerpt_with_line_22(tmp_path, '2023-11-16 18:16:30.1,"37')
    assert main(["trace", "info", "--trace", str(path), "--skip-bad-rows"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"{path}:22: an opening quote on this line is not closed" in err


NOTE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens,Note\n"


def test_a_quoted_field_closed_on_a_later_line_is_read_as_csv_reads_it(tmp_path: Path) -> None:
    """RFC 4180 allows line breaks inside a quoted field (a prompt's text, in a column the
    format ignores): the row is read, named by the line it starts on, and the rows after it
    keep their own lines."""
    path = tmp_path / "note.csv"
    path.write_text(NOTE_HEADER + '2023-11-16 18:15:46.0,10,5,"multi\nline"\n'
                    + "2023-11-16 18:15:47.0,abc,5,x\n"
                    + '2023-11-16 18:15:48.0,12,6,"a ""quoted""\r\nreply, with commas"\n'
                    + "2023-11-16 18:15:49.0,13,7,\n")
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert str(caught.value) == (
        f"{path}:4: field 'ContextTokens': expected a non-negative integer, got 'abc'")
    trace = load_trace(path, TraceOptions(skip_bad_rows=True))
    assert [(r.num_prompt_tokens, r.num_output_tokens) for r in trace.requests] == [
        (10, 5), (12, 6), (13, 7)]
    assert trace.counts["num_source_rows"] == 4
    assert trace.counts["skipped_bad_rows"] == 1


@pytest.mark.parametrize("rows", [
    # a runaway quote in a column the format reads, closed at the end of a later field
    '2023-11-16 18:15:47.0,"10,5,x\n2023-11-16 18:15:48.0,11",6,y\n',
    # a runaway quote in a text column, closed by a stray quote: a whole row inside the field
    '2023-11-16 18:15:47.0,10,5,"x\n2023-11-16 18:15:48.0,11,6,y\n2023-11-16 18:15:49.0,12"\n',
])
def test_a_runaway_quote_in_a_file_with_a_text_column_is_still_refused(
        tmp_path: Path, rows: str) -> None:
    path = tmp_path / "runaway.csv"
    path.write_text(NOTE_HEADER + "2023-11-16 18:15:46.0,10,5,x\n" + rows
                    + "2023-11-16 18:15:50.0,13,7,z\n")
    with pytest.raises(TraceError) as caught:
        load_trace(path, TraceOptions(skip_bad_rows=True))
    assert str(caught.value).startswith(
        f"{path}:3: an opening quote on this line is not closed (lines 4 to")
