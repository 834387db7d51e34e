"""The replay's configuration record and what it drives besides requests (telemetry)."""

from __future__ import annotations

import asyncio
import math
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit

import httpx

from harness.live.prompts import (
    DEFAULT_PREFIX_BLOCK_NUM_TOKENS,
    load_tokenizer,
)
from harness.live.protocols import (
    LENGTH_CONTROLS,
    PATHS,
    PROTOCOLS,
    LengthControl,
    PriorityPlan,
    ProtocolName,
    plan_priority,
)
from harness.live.sse_framing import DEFAULT_MAX_EVENT_BYTES
from harness.metrics import DEFAULT_CLIENT_LAG_THRESHOLD_S, Slo
from harness.redact import env_var_name

if TYPE_CHECKING:
    from harness.traces import TraceRequest

MANIFEST_FILE = "manifest.json"
SPIN_WINDOW_NS = 2_000_000  # the last 2 ms before a send are yielded through, not slept
PROGRESS_INTERVAL_NS = 100_000_000
DRAIN_TIMEOUT_S = 0.5  # after the end event, wait this long for the body's end to reuse the socket


class TelemetrySource(Protocol):
    """Something that samples the engine while the replay runs (e.g. a Prometheus scraper).

    ``run`` starts when the replay starts and must return soon after ``stop`` is set."""

    async def run(self, stop: asyncio.Event) -> None: ...


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """How to replay a trace against one server. Validated once, by ``validate``."""

    target_url: str  # e.g. http://127.0.0.1:8000
    protocol: ProtocolName = "openai"
    model: str | None = None  # the served model name; omitted from requests when None
    mode: Literal["open", "closed"] = "open"
    concurrency: int | None = None  # closed loop: number of users
    max_concurrency: int | None = None  # open loop: cap on requests in flight
    timeout_s: float = 600.0  # per request, from send to the end of its stream
    tokenizer_path: str | None = None  # local HF tokenizer folder or tokenizer.json; no hub
    slo: Slo | None = None
    client_lag_threshold_s: float = DEFAULT_CLIENT_LAG_THRESHOLD_S
    api_key_env: str | None = None  # name of the env var holding a bearer key; never logged
    seed: int = 0  # prompt content
    prefix_block_num_tokens: int = DEFAULT_PREFIX_BLOCK_NUM_TOKENS  # per prefix hash (Mooncake)
    fsync_interval_s: float = 1.0
    # Build every request body before t0 when the trace's prompts total at most this many tokens;
    # above it, each body is built just before its request (while the scheduler waits).
    prebuild_max_prompt_tokens: int = 20_000_000
    # "lean": harness.live.sse_client parses responses in the socket callback (the fast path);
    # "httpx": httpx with harness.live.http_pool's transport. Both time at the socket.
    http_client: Literal["lean", "httpx"] = "lean"
    length_control: LengthControl = "vllm"  # how an OpenAI server is asked for exact lengths
    # Sleep until this long before each send, then yield to the event loop until the instant:
    # the loop's timers are only millisecond-precise. 0 = plain sleeps.
    spin_window_s: float = SPIN_WINDOW_NS / 1e9
    # An SSE event larger than this ends its request as protocol_error (a token event is a few
    # hundred bytes; a runaway one must not hold the event loop that times every other stream).
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    # Ask for llama.cpp's exact running token count on every event ("timings_per_token"); off
    # by default because servers that validate request fields may refuse or warn about it.
    timings_per_token: bool = False
    # Mixed into every prompt's content ("" = none: the same prompts run after run). A server
    # that caches prompts (llama.cpp by default, vLLM with prefix caching) answers a repeated
    # prompt from its cache; a per-run salt keeps runs apart (harness.live.prompts).
    prompt_salt: str = ""
    # The engine behind target_url and the scheduling policy (the uniform knob's value) it runs
    # with, as far as batchlab knows them: ``replay --engine`` sets both (run_live). They decide
    # whether a request's priority is sent and in which scale (``priority_plan``). None: not
    # known; a plain --target replay names no engine and sends vLLM's convention.
    engine: str | None = None
    server_policy: str | None = None

    def priority_plan(self, requests: Iterable[TraceRequest]) -> PriorityPlan:
        """What the replay does with the priorities of ``requests`` on this server
        (``harness.live.protocols.plan_priority``)."""
        return plan_priority((r.priority for r in requests), self.protocol, self.engine,
                             self.server_policy)

    def validate(self) -> None:
        bad_url = target_url_problem(self.target_url, "target_url")
        if bad_url:
            raise ValueError(bad_url)
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol: {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        if self.length_control not in LENGTH_CONTROLS:
            raise ValueError(f"length_control: {self.length_control!r} is not one of "
                             f"{', '.join(LENGTH_CONTROLS)}")
        if self.http_client not in ("lean", "httpx"):
            raise ValueError(f"http_client: {self.http_client!r} is not lean or httpx")
        if self.mode not in ("open", "closed"):
            raise ValueError(f"mode: {self.mode!r} is not open or closed")
        if self.mode == "closed" and self.concurrency is None:
            raise ValueError("concurrency: the closed loop needs a number of users (--concurrency)")
        if self.mode == "open" and self.concurrency is not None:
            raise ValueError("concurrency: only for the closed loop; the open loop's cap is "
                             "max_concurrency (--max-concurrency)")
        if self.mode == "closed" and self.max_concurrency is not None:
            raise ValueError("max_concurrency: only for the open loop; the closed loop's users "
                             "are --concurrency")
        for name in ("concurrency", "max_concurrency", "prefix_block_num_tokens",
                     "max_event_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if not (isinstance(self.spin_window_s, int | float) and 0 <= self.spin_window_s < 1):
            raise ValueError(
                f"spin_window_s: must be in [0, 1) seconds, got {self.spin_window_s!r}")
        for name in ("timeout_s", "client_lag_threshold_s", "fsync_interval_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: must be a positive number of seconds, got {value!r}")
        for name in ("engine", "server_policy"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name}: must be a name or None, got {value!r}")
        if self.api_key_env is not None:
            bad_name = api_key_env_problem(self.api_key_env, "api_key_env")
            if bad_name:
                raise ValueError(bad_name)
            if self.api_key_env not in os.environ:
                raise ValueError(UNSET_KEY_VARIABLE.format(field="api_key_env"))
        if self.tokenizer_path:
            # loaded here (once: it is kept), before a run folder is claimed and an earlier
            # run's files cleared: a tokenizer that will not load is refused as bad input
            load_tokenizer(self.tokenizer_path)

    @property
    def url(self) -> str:
        return self.target_url.rstrip("/") + PATHS[self.protocol]

    def as_manifest(self) -> dict[str, Any]:
        d = asdict(self)
        d["slo"] = self.slo.as_dict() if self.slo is not None else None
        return d  # api_key_env is a variable name, never the key


def target_url_problem(url: str, name: str) -> str | None:
    """Why ``url`` (the field or flag ``name``) is not the base URL of a server both HTTP
    clients can reach, in one line naming it; None when it is one.

    Checked before anything is sent or a run folder claimed: a port out of range or an
    unclosed ``[`` otherwise surfaces as an exception from deep in a client (``OverflowError``
    from ``connect()``, ``httpx.InvalidURL``) instead of a refusal. What may carry a
    credential (user and password, the query) is not repeated."""
    why = _url_defect(url)
    if why is None:
        return None
    return f"{name}: {_shown_bad_url(url)!r}: not an http(s)://host[:port] URL ({why})"


def _shown_bad_url(url: str) -> str:
    """A refused URL as its refusal may quote it: everything up to its last "@" masked, whether
    "//" comes before it (``http://u:pw@host``) or not (``u:pw@host``, ``http:/u:pw@host``),
    then the query and fragment cut. Not yet a URL, so not parsed as one: a password may hold
    an unescaped "/", "?" or "#" (``http://u:pw/x#y@host``), so the last "@" of the whole text
    ends what is masked, even one past a path (``http://***@b`` for ``http://h/a@b``)."""
    shown = re.sub(r"^((?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?.*@", lambda m: f"{m.group(1) or ''}***@",
                   url, flags=re.S)
    return re.sub(r"[?#].*", "?***", shown, flags=re.S)


# The variable's name is not repeated: a key pasted in its place can be a name too
# (hf_PLANTEDtoken0987654321), and this message reaches the console, report.md and status.json.
# Whoever reads it gave the name one line above (the command) or in the scenario's file.
UNSET_KEY_VARIABLE = ("{field}: the environment variable it names is not set (its name is not "
                      "repeated here: it may be the key itself); export it, then run again")


def api_key_env_problem(name: str, field: str) -> str | None:
    """Why ``name`` (the field or flag ``field``) cannot name the variable that holds the API
    key, or None. What is no variable name is most likely the key itself, pasted in its
    place: it is not repeated."""
    if env_var_name(name):
        return None
    return (f"{field}: expected the NAME of the environment variable that holds the key "
            "(letters, digits and _, not starting with a digit); what was given is not one, "
            "and is not repeated here (it may be the key itself)")


def _url_defect(url: str) -> str | None:
    if not url:
        return "empty"
    if any(c.isspace() or not c.isprintable() for c in url):
        return "it holds whitespace or a control character"
    try:
        parts = urlsplit(url)
        port = parts.port  # parsed on access: out of range or not a number raises
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", ...
        return _parser_words(str(exc))
    if parts.scheme not in ("http", "https"):
        # without "//", what reads as a scheme may be a user name (u:pw@host): not repeated
        return (f"scheme {parts.scheme!r}" if parts.scheme and "//" in url
                else "no http:// or https://")
    if not parts.hostname:
        return "no host"
    if port == 0:
        return "port 0 is not one a server listens on"
    if parts.query or parts.fragment:
        return "a base URL has no ?query or #fragment: the request path is added to it"
    try:
        httpx.URL(url)  # the httpx client's own parser must take it too
    except httpx.InvalidURL as exc:
        return _parser_words(str(exc))
    return None


def _parser_words(said: str) -> str:
    """What a URL parser said of a URL, without the part of it the parser quotes: urlsplit
    quotes as its "port" whatever follows the last ":" of the authority, a password when that
    holds a "/" (``Port could not be cast to integer value as 'pw'``), and the whole authority
    when NFKC normalization changes it; httpx quotes a host or port (``Invalid port: 'x'``).
    The words before the first quote are kept (``Invalid port``)."""
    if said.startswith("Port could not be cast"):
        return "its port is not a number"
    if said.startswith("netloc"):
        return "its user, password, host or port changes under NFKC normalization"
    return re.split(r"['\"]", said, maxsplit=1)[0].rstrip(" :,") or "the URL parser refused it"


# ---------------------------------------------------------------- precise waiting


