"""Live runs: replaying a trace against a serving engine over HTTP, and everything around it.

    run.py       plan -> launch or attach -> replay with telemetry -> teardown (``run_live``)
    replay.py    open- and closed-loop sending with exact timing; records as requests finish
    config.py    ``ReplayConfig``
    wire.py      one request on the wire (lean streaming client, or httpx), stamped at the socket
    sse_client.py, http_pool.py   the two HTTP stacks behind the wire
    protocols.py request bodies and stream parsing (OpenAI completions/chat, TGI)
    sse_framing.py  server-sent events from raw bytes, linear time, a size cap per event
    prompts.py   prompts of exact token length, shared prefixes
    recorder.py  the append-only records.jsonl
    rundir.py    the live run folder's manifest, consolidation, ``rebuild_summary``
    telemetry.py scraping /metrics into telemetry.parquet
    testing.py   a loopback server on a known schedule, for tests and benches
"""
