"""Which models, GPUs and data types the published figures behind a prediction's accuracy
are of.

A prediction's measured accuracy (``adapters.reference.prediction``) holds for the workloads
it was measured on: a simulation of another model, another GPU, or weights or a KV cache of
another data type has an error nobody measured, and its record says so rather than quote the
figures as if they applied. The models, GPUs, weights dtypes and KV-cache dtypes (as the rows'
``weights_dtype`` and ``kv_cache_dtype`` state them: ``bf16``, which FP16 rows are filed
under, or ``fp8``) are taken from the measurement set and written by ``batchlab
check-published --write-docs`` (and ``--catalog --write-docs``) to::

    adapters/reference/published_coverage.json
        catalog:  every row (the catalog's accuracy is measured on all of them)
        profiles: {profile: the rows its fit never saw (the held-out figures it quotes)}
    each with ``by_kind``: the same for each kind of figure (throughput, TTFT, ...), whose
    error is quoted on its own: a GPU that throughput figures cover may have no TTFT figure.

``tests/harness/test_published_coverage.py`` fails when the file is not what the rows give.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from adapters.reference.prediction import COVERAGE_FILE, coverage_record
from harness.prediction import KINDS
from harness.published.fit import split
from harness.published.rows import PublishedRow


def coverage(rows: Sequence[PublishedRow]) -> dict[str, Any]:
    """The file's content for ``rows`` (the whole measurement set)."""
    _, held = split(rows)
    return {
        "note": "models, GPUs, weights dtypes and KV-cache dtypes of the published figures "
                "each accuracy was measured on; written by `batchlab check-published "
                "--write-docs`",
        "catalog": _covers(rows),
        "profiles": {name: _covers([r for r in held if r.profile_name == name])
                     for name in sorted({r.profile_name for r in held})},
    }


def write_coverage(rows: Sequence[PublishedRow]) -> None:
    COVERAGE_FILE.write_text(json.dumps(coverage(rows), indent=2) + "\n")
    coverage_record.cache_clear()


def _covers(rows: Sequence[PublishedRow]) -> dict[str, Any]:
    return {**_of(rows),
            "by_kind": {kind: _of([r for r in rows if r.kind == kind])
                        for kind in KINDS if any(r.kind == kind for r in rows)}}


def _of(rows: Sequence[PublishedRow]) -> dict[str, list[str]]:
    return {"models": sorted({r.model for r in rows}), "gpus": sorted({r.gpu for r in rows}),
            "weights_dtypes": sorted({r.weights_dtype for r in rows}),
            "kv_cache_dtypes": sorted({r.kv_cache_dtype for r in rows})}
