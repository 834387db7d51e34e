"""A scenario's ``mix`` gives the requests of its traces and nothing more: prefix ids apart for
each trace, a load's time scale on top of each trace's own, every trace named in the manifest;
and ``--priority-fraction`` rounds halves up."""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import pytest

from adapters.knobs import Knobs
from adapters.reference.config import ReferenceConfig
from harness.manifest import trace_manifest
from harness.scenario import LoadPoint, load_cell_trace, load_scenario
from harness.scenario.expand import merge_traces, trace_options
from harness.sim.driver import simulate
from harness.target import RunOptions, TargetSpec
from harness.targets import make_target
from harness.traces import DATA_DIR, MixPart, Trace, TraceOptions, TraceRequest, load_trace
from harness.traces.records import requests_digest

MOONCAKE = DATA_DIR / "mooncake_conversation_excerpt.jsonl"
AZURE = DATA_DIR / "azure_conv_excerpt.csv"

# The excerpt twice: the same file, so every hash id of one copy is also in the other. Clipped
# at 16384 tokens, as chat clients cut their oldest context: 29 rows get ids of their own,
# from their line numbers, the same lines in both copies.
TWO_COPIES = """\
    name: twice
    question: q
    trace:
      path: mooncake_conversation_excerpt.jsonl
      max_model_len: 16384
      on_too_long: clip
      mix:
        - {path: mooncake_conversation_excerpt.jsonl, max_model_len: 16384, on_too_long: clip}
    model: llama-3.1-8b
    gpu: h100-sxm
    engines: [{name: e, engine: reference, knobs: {prefix_caching: true}}]
"""

# scenarios/chunked-prefill.yaml's trace: its Mooncake part has a time scale of its own
CHAT_AND_LONG = """\
    name: chat-and-long
    question: q
    trace:
      path: azure_conv_excerpt.csv
      end_s: 90
      priority: 1
      mix:
        - {path: mooncake_conversation_excerpt.jsonl, end_s: 30, time_scale: 3,
           max_model_len: 32768, on_too_long: clip, priority: 0}
    model: llama-3.1-8b
    gpu: h100-sxm
    engines: [{name: e, engine: reference}]
    load: {time_scales: [1, 2]}
"""


def scenario_trace(tmp_path: Path, text: str, load: LoadPoint | None = None) -> Trace:
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(text))
    trace: Trace = load_cell_trace(load_scenario(path), load or LoadPoint())
    trace.check_invariants()
    return trace


def never_evicting_hits(requests: tuple[TraceRequest, ...] | list[TraceRequest]) -> int:
    config = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", prefix_caching=True,
                             max_model_len=16384, num_gpu_blocks=2_000_000)
    result = simulate(requests, config)
    assert result.prefix_cache is not None
    assert result.prefix_cache["preempted_queries_tokens"] == 0  # nothing was evicted
    hits: int = result.prefix_cache["hits_tokens"]
    return hits


def part_of(trace: Trace, index: int) -> list[TraceRequest]:
    """The requests of the mix's ``index``-th trace (``m<i>-`` ids for the added ones)."""
    if index:
        return [r for r in trace.requests if r.request_id.startswith(f"m{index}-")]
    return [r for r in trace.requests if not r.request_id.startswith("m")]


# ---------------------------------------------------------------- prefix ids


def test_a_mix_of_two_copies_hits_each_copys_own_prefixes_and_no_more(tmp_path: Path) -> None:
    """With a cache that never evicts, each copy finds the prefixes it finds alone; a prefix
    of one copy is not the other's (each Mooncake file numbers its ids from 0)."""
    alone = load_trace(MOONCAKE, TraceOptions(max_model_len=16384, on_too_long="clip"))
    assert alone.counts["clipped_too_long"] > 0
    mix = scenario_trace(tmp_path, TWO_COPIES)
    assert len(mix) == 2 * len(alone)
    own = never_evicting_hits(alone.requests)
    assert own > 0
    assert never_evicting_hits(mix.requests) == 2 * own


def test_mixed_traces_share_no_prefix_id_and_keep_their_own_sharing(tmp_path: Path) -> None:
    alone = load_trace(MOONCAKE, TraceOptions(max_model_len=16384, on_too_long="clip"))
    mix = scenario_trace(tmp_path, TWO_COPIES)
    first, second = part_of(mix, 0), part_of(mix, 1)
    ids = [{h for r in part for h in r.prefix_hash_ids} for part in (first, second)]
    assert ids[0] and ids[1] and not ids[0] & ids[1]
    # the clipped rows' own ids (from line numbers, the same in both files) are apart too
    clipped = [r.request_id for r in alone.requests if min(r.prefix_hash_ids) < 0]
    assert clipped
    for row in clipped:
        one = next(r for r in first if r.request_id == row)
        two = next(r for r in second if r.request_id == f"m1-{row}")
        assert not set(one.prefix_hash_ids) & set(two.prefix_hash_ids)
    # each copy's ids are its own renamed one for one: the same requests share a block
    for part in (first, second):
        by_row = {r.request_id.removeprefix("m1-"): r for r in part}
        renamed: dict[int, int] = {}
        for r in alone.requests:
            ids_in_mix = by_row[r.request_id].prefix_hash_ids
            assert len(ids_in_mix) == len(r.prefix_hash_ids)
            for old, new in zip(r.prefix_hash_ids, ids_in_mix, strict=True):
                assert renamed.setdefault(old, new) == new
        assert len(set(renamed.values())) == len(renamed)


def test_a_mix_has_the_same_ids_and_digest_every_time_and_its_digest_is_its_requests(
        tmp_path: Path) -> None:
    a, b = scenario_trace(tmp_path, TWO_COPIES), scenario_trace(tmp_path, TWO_COPIES)
    assert a.requests == b.requests and a.digest == b.digest
    assert a.digest == requests_digest(a.requests)
    # the same requests as a merge of the two parts as the manifest names them
    again = merge_traces([MixPart(load_trace(MOONCAKE, TraceOptions(
        max_model_len=16384, on_too_long="clip"))) for _ in range(2)])
    assert again.digest == a.digest
    other = scenario_trace(tmp_path, TWO_COPIES.replace(
        "        - {path: mooncake_conversation_excerpt.jsonl,",
        "        - {path: mooncake_conversation_excerpt.jsonl, limit: 299,"))
    assert other.digest != a.digest


# ---------------------------------------------------------------- time scales


def test_a_load_time_scale_multiplies_each_mix_parts_own(tmp_path: Path) -> None:
    for scale in (1.0, 2.0):
        mix = scenario_trace(tmp_path, CHAT_AND_LONG, LoadPoint("time_scale", scale))
        long = load_trace(MOONCAKE, TraceOptions(end_s=30, max_model_len=32768,
                                                 on_too_long="clip"))
        chat = load_trace(AZURE, TraceOptions(end_s=90))
        assert long.duration_s == 27.0
        assert max(r.arrival_s for r in part_of(mix, 1)) == 27.0 * 3 * scale
        assert max(r.arrival_s for r in part_of(mix, 0)) == pytest.approx(chat.duration_s
                                                                          * scale)


def test_a_load_time_scale_multiplies_a_single_traces_own(tmp_path: Path) -> None:
    text = """\
        name: one
        question: q
        trace: {path: azure_conv_excerpt.csv, limit: 20, time_scale: 0.5}
        model: llama-3.1-8b
        gpu: h100-sxm
        engines: [{name: e, engine: reference}]
        load: {time_scales: [4]}
    """
    path = tmp_path / "one.yaml"
    path.write_text(textwrap.dedent(text))
    scenario = load_scenario(path)
    load = scenario.loads[0]
    assert trace_options(scenario, load)["time_scale"] == 2.0
    trace: Trace = load_cell_trace(scenario, load)
    recorded = load_trace(AZURE, TraceOptions(limit=20))
    assert trace.duration_s == pytest.approx(recorded.duration_s * 2)


# ---------------------------------------------------------------- the manifest


def test_a_mixs_manifest_names_every_part_and_each_loads_again(tmp_path: Path) -> None:
    mix = scenario_trace(tmp_path, CHAT_AND_LONG, LoadPoint("time_scale", 2.0))
    out = tmp_path / "run"
    spec = TargetSpec("reference", "simulate", knobs=Knobs.from_mapping({"max_model_len": 32768}))
    make_target(spec).run(mix, out, RunOptions(write_report=False))
    record = json.loads((out / "manifest.json").read_text())["trace"]
    assert record["digest"] == mix.digest and record["num_requests"] == len(mix)
    # no one file, no one set of options: each part's are in parts
    assert record["path"] is None and record["file_sha256"] is None and record["options"] == {}
    parts = record["parts"]
    assert [Path(p["path"]) for p in parts] == [AZURE, MOONCAKE]
    assert [p["priority"] for p in parts] == [1, 0]
    assert parts[1]["options"]["time_scale"] == 6.0 and parts[0]["options"]["time_scale"] == 2.0
    loaded = []
    for part in parts:
        path = Path(part["path"])
        assert part["file_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        trace = load_trace(path, TraceOptions(**part["options"]))
        assert trace.digest == part["digest"] and len(trace) == part["num_requests"]
        loaded.append(MixPart(trace, part["priority"]))
    assert merge_traces(loaded).digest == record["digest"]


def test_a_single_traces_manifest_has_no_parts() -> None:
    trace = load_trace(AZURE, TraceOptions(limit=5))
    record = trace_manifest(trace)
    assert "parts" not in record
    assert record["path"] == str(AZURE.resolve()) and record["options"] == {"limit": 5}


# ---------------------------------------------------------------- priority fraction


@pytest.mark.parametrize(("fraction", "num_requests", "num_high"), [
    (0.1, 5, 1), (0.3, 5, 2), (0.5, 5, 3), (0.7, 5, 4), (0.9, 5, 5), (0.0, 5, 0), (1.0, 5, 5),
    (0.29, 50, 15),  # 14.5 in decimals; 14.499... in floats
    (0.25, 2000, 500),
])
def test_priority_fraction_rounds_halves_up(fraction: float, num_requests: int,
                                            num_high: int) -> None:
    trace = load_trace(AZURE, TraceOptions(limit=num_requests, priority_fraction=fraction))
    priorities = [r.priority for r in trace.requests]
    assert priorities.count(0) == num_high
    assert priorities.count(1) == num_requests - num_high
