"""Secrets never reach a file: one redaction for manifests, reports, cell records and logs.

What is a secret is decided by an allow-list, not by guessing from names:

- an environment variable given to an engine (``--engine-env K=V``, scenario ``env:``, docker's
  ``-e K=V``) keeps its value only when ``K`` is in ``SAFE_ENV_NAMES``; any other value is
  ``***`` (``MY_AUTH=zzz`` is as secret as ``HF_TOKEN=hf_...``);
- in an argv (batchlab's own command line, an engine's launch argv, ``--extra-arg`` values), the
  value after a flag with a secret word in its name (``--api-key X``, ``--hf-token=X``, a
  compound such as ``--ngrok-authtoken X``; ``_SECRET_WORDS``) or a known short alias of one
  (llama.cpp's ``-hft X``; ``_SECRET_ALIASES``) is ``***``, every value up to the next flag for
  a flag that takes several (``MULTI_VALUE_SECRET_FLAGS``: vLLM's ``--api-key K1 K2``); an
  item holding a flag and its value in one string (``"--api-key sk-1"``, a YAML list item or a
  quoted ``--extra-arg``) is read as the words it holds (``"--api-key ***"``); flags ending in
  ``-env`` name a variable, not a value, and are kept, unless what follows is no variable name
  or looks like a key (a key pasted in its place, ``stored_env_name``);
- a record's field ending in ``_env`` that holds a string (a scenario's ``api_key_env``) names
  a variable: kept as the flag's value is, else ``***``;
- a URL's user and password (``http://user:pass@host``) are ``***`` wherever a URL is stored or
  shown: argv items (``--url=http://***@host`` too), string values of a record, free text
  (``redact_url``);
- free text (server logs, error messages) has every known secret value replaced
  (``scrub_text``, ``scrub_files``): the values redacted above, a URL's password and the API
  key a replay read from its variable.

    redact_argv(["batchlab", "replay", "--engine-env", "HF_TOKEN=abc", "--extra-arg=--api-key",
                 "--extra-arg=sk-1"])
    -> ["batchlab", "replay", "--engine-env", "HF_TOKEN=***", "--extra-arg=--api-key",
        "--extra-arg=***"]
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shlex
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, AnyStr, BinaryIO, Generic
from urllib.parse import unquote

MASK = "***"

# Known-safe environment names: batchlab's own launch settings, knobs that engines read from
# the environment (adapters/tgi.py), and device/thread settings. Keep it short and explicit.
SAFE_ENV_NAMES = frozenset({
    "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
    "PREFIX_CACHING", "PREFILL_CHUNKING", "TGI_WIGGLE_ROOM",
    "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM",
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_ATTENTION_BACKEND",
    "VLLM_LOGGING_LEVEL", "VLLM_USE_V1", "VLLM_WORKER_MULTIPROC_METHOD",
    "PYTORCH_CUDA_ALLOC_CONF", "LOG_LEVEL", "RUST_LOG",
})

# Flags whose next argument is KEY=VALUE environment: batchlab's, docker's and podman's.
_ENV_FLAGS = frozenset({"--engine-env", "--env", "-e"})
_EXTRA_ARG = "--extra-arg"
# Secret flags that take several values (vLLM: ``--api-key K1 K2``, any of which is accepted):
# every argument up to the next flag is masked, not only the first.
MULTI_VALUE_SECRET_FLAGS = frozenset({"--api-key"})
# A URL's userinfo: after "scheme://", up to the last "@" of the authority (a password may hold
# an unescaped "@"; the host may not). Not past a path, query, fragment, whitespace or quote.
_URL_USERINFO = re.compile(r"(?<=://)[^/?#\s\"<>\\`]*@")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A word of a flag's name (split on "-", "_", ".") that ends in one of these names a secret:
# the word itself (--api-key, --hf-token) or a compound ending in it (TGI's --ngrok-authtoken,
# --apikey, --accesskey). Only the ending counts: "tokens" and "tokenizer" (--max-total-tokens,
# --tokenizer) begin with "token" and are counts or paths, kept.
_SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "credential", "credentials",
                 "auth", "cookie", "bearer")
# Short aliases of secret flags, whose letters name no secret word: llama.cpp's -hft
# (--hf-token, ggml-org/llama.cpp common/arg.cpp). Compared without the leading dashes.
_SECRET_ALIASES = frozenset({"hft"})
# Which secret values are scrubbed from free text (``_scrubbable``): one of _ALWAYS_SCRUB_LEN
# characters or more always; a shorter one only from _MIN_SCRUB_LEN on and when it is not a
# number or a boolean-like word, which would blank every "1", "true" or "2048" of a log.
# Structured places (env, argv) are redacted whatever the value.
_MIN_SCRUB_LEN = 3
_ALWAYS_SCRUB_LEN = 8
_PLAIN_VALUES = frozenset({"true", "false", "yes", "no", "on", "off", "none", "null"})
# Free text only: structured files (manifest, summary, records) are redacted field by field,
# and a value replaced inside them could hit a key or a knob value (a secret "fp16").
_TEXT_SUFFIXES = (".log", ".txt")


def safe_env_name(name: str) -> bool:
    return name in SAFE_ENV_NAMES


def env_var_name(text: str) -> bool:
    """Whether ``text`` can name an environment variable (``[A-Za-z_][A-Za-z0-9_]*``). Where a
    NAME is asked for (``--api-key-env VAR``), anything else is most likely the key itself,
    pasted in its place: refused without repeating it, and masked where an argv is stored."""
    return _ENV_NAME.fullmatch(text) is not None


# A part of a variable's name (between "_") this long or longer that mixes letters with digits,
# or lower with upper case, is a key's body rather than a word: ``key_like_name``.
_KEY_LIKE_PART_LEN = 16


def key_like_name(text: str) -> bool:
    """Whether a variable name looks like a key pasted in its place: a part of it between "_"
    of ``_KEY_LIKE_PART_LEN`` (16) characters or more mixes letters with digits or lower with
    upper case (``hf_PLANTEDtoken0987654321``, ``AKIAIOSFODNN7EXAMPLE``). The parts of a
    variable's name are words (``VLLM_API_KEY``, ``my_key_2``, ``TOKENIZERS_PARALLELISM``)."""
    for part in text.split("_"):
        if len(part) < _KEY_LIKE_PART_LEN:
            continue
        letters = [c for c in part if c.isalpha()]
        has_digit = len(letters) < len(part)  # a name's other characters are digits and "_"
        mixed_case = any(c.islower() for c in letters) and any(c.isupper() for c in letters)
        if letters and (has_digit or mixed_case):
            return True
    return False


def stored_env_name(text: str) -> bool:
    """Whether ``text``, given where a variable's NAME belongs (``--api-key-env VAR``, a
    scenario's ``api_key_env``), may be stored and shown: a variable name that does not look
    like a key (``key_like_name``). Anything else is masked."""
    return env_var_name(text) and not key_like_name(text)


def redact_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """The environment with every value not on the allow-list masked."""
    return {str(k): (v if safe_env_name(str(k)) else MASK) for k, v in env.items()}


def _redact_assignment(text: str) -> str:
    key, sep, _ = text.partition("=")
    return text if not sep or safe_env_name(key) else f"{key}={MASK}"


def secret_flag(token: str) -> bool:
    """``--api-key``, ``--hf-token=...``, ``--auth``, ``--ngrok-authtoken``, ``-hft``: a flag
    named like a secret."""
    return _secret_named(token) and not _names_variable(token)


def _secret_named(token: str) -> bool:
    if not token.startswith("-") or token in _ENV_FLAGS:
        return False
    name = token.lstrip("-").split("=", 1)[0].lower()
    return name in _SECRET_ALIASES or any(word.endswith(_SECRET_WORDS)
                                          for word in re.split(r"[-_.]", name))


def _names_variable(token: str) -> bool:
    """``--api-key-env``: the flag names a variable (``VAR``), not a value."""
    name = token.lstrip("-").split("=", 1)[0].lower()
    return name.endswith("-env") or name.endswith("_env")


def redact_url(text: str) -> str:
    """``text`` with the user and password of every URL in it masked:
    ``http://bob:pw@host:8000/v1`` -> ``http://***@host:8000/v1`` (a lone user, often a token:
    ``https://ghp_x@host`` -> ``https://***@host``). Anything else is unchanged."""
    return _URL_USERINFO.sub(MASK + "@", text) if "@" in text else text


def url_secrets(text: str) -> set[str]:
    """The credentials of every URL in ``text``, as ``redact_url`` masks them: a password
    (``user:pw@``), or the lone user (``token@``); also percent-decoded, as a server may log it."""
    values: set[str] = set()
    for found in _URL_USERINFO.finditer(text):
        user, colon, password = found.group()[:-1].partition(":")
        value = password if colon else user
        values.update(v for v in (value, unquote(value)) if v)
    return values


def _redact_tokens(tokens: list[str]) -> list[str]:
    """Redact one flat argv: env assignments, values of secret flags, URL credentials."""
    return [redact_url(token) for token in _redact_flags(tokens)]


# An argv item that is a flag, then whitespace before any "=": "--api-key VALUE" written as one
# YAML list item or one quoted --extra-arg.
_FLAG_THEN_SPACE = re.compile(r"-[^=\s]*\s")
_WORD = re.compile(r"(\S+)(\s*)")


def _item_words(token: str, *, a_value: bool = False) -> list[tuple[str, str]]:
    """An argv item as the argv it would be split into: (word, the whitespace after it). An
    item that starts with a flag followed by whitespace (``"--api-key sk-1"``,
    ``"--port 80 --hf-token hf_x"``) is read as its words, so that a secret flag in it masks
    the value after it as in a split argv; any other item is one word (``"--api-key=a b"``
    masks all of ``a b``, as a value after ``=`` always does). So is an item that is
    ``a_value``: the value of the secret flag before it (``--hf-token "-a b"``). Inside an item
    read as words, a secret flag's ``=value`` runs on to the next flag
    (``"--port 80 --api-key=my pass phrase"``: all of ``my pass phrase``)."""
    if a_value or not _FLAG_THEN_SPACE.match(token):
        return [(token, "")]
    words: list[tuple[str, str]] = []
    for m in _WORD.finditer(token):
        word, space = m.group(1), m.group(2)
        if words and not word.startswith("-") and "=" in words[-1][0] \
                and secret_flag(words[-1][0]):
            last, gap = words[-1]
            words[-1] = (last + gap + word, space)  # more of the value after "="
        else:
            words.append((word, space))
    return words


def _takes_value(token: str) -> bool:
    """A secret flag whose value is the next argv item (no ``=``)."""
    return "=" not in token and secret_flag(token)


def _redact_flags(tokens: list[str]) -> list[str]:
    """Env assignments and values of secret flags of one flat argv masked; an item holding a
    flag and its value (``"--api-key sk-1"``) is masked as the two would be
    (``"--api-key ***"``)."""
    items = [_item_words(token, a_value=k > 0 and _takes_value(tokens[k - 1]))
             for k, token in enumerate(tokens)]
    words = iter(_redact_words([word for item in items for word, _ in item]))
    return ["".join(next(words) + space for _, space in item) for item in items]


def _redact_words(tokens: list[str]) -> list[str]:
    """``_redact_flags`` of an argv whose items are single words."""
    out = list(tokens)
    i = 0
    while i < len(out):
        token = out[i]
        flag, eq, value = token.partition("=")
        if flag in _ENV_FLAGS:
            if eq:
                out[i] = f"{flag}={_redact_assignment(value)}"
            elif i + 1 < len(out):
                out[i + 1] = _redact_assignment(out[i + 1])
                i += 1
        elif _secret_named(token) and _names_variable(token):
            # --api-key-env VAR is kept; a key pasted in place of VAR is not
            if eq and not stored_env_name(value):
                out[i] = f"{flag}={MASK}"
            elif not eq and i + 1 < len(out) and not out[i + 1].startswith("--") \
                    and not stored_env_name(out[i + 1]):
                out[i + 1] = MASK
                i += 1
        elif secret_flag(token):
            if eq:
                out[i] = f"{flag}={MASK}"
            else:
                several = flag in MULTI_VALUE_SECRET_FLAGS
                while i + 1 < len(out) and not out[i + 1].startswith("--"):
                    out[i + 1] = MASK
                    i += 1
                    if not several:
                        break
        i += 1
    return out


def redact_argv(argv: Sequence[Any]) -> list[str]:
    """An argv safe to store: env values, secret flag values and URL credentials masked, also
    inside the ``--extra-arg`` values of batchlab's command line (which form an argv of their
    own)."""
    return _redact_argv(argv, _redact_tokens)


def _redact_argv_flags(argv: Sequence[Any]) -> list[str]:
    """``redact_argv`` but for URL credentials (``secret_values`` finds those itself)."""
    return _redact_argv(argv, _redact_flags)


def _redact_argv(argv: Sequence[Any], redact: Callable[[list[str]], list[str]]) -> list[str]:
    tokens = [str(a) for a in argv]
    # --extra-arg values: (index, prefix to keep, value)
    extra: list[tuple[int, str, str]] = []
    rest: list[int] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == _EXTRA_ARG and i + 1 < len(tokens):
            extra.append((i + 1, "", tokens[i + 1]))
            rest.append(i)
            i += 2
            continue
        if token.startswith(_EXTRA_ARG + "="):
            extra.append((i, _EXTRA_ARG + "=", token[len(_EXTRA_ARG) + 1:]))
        else:
            rest.append(i)
        i += 1
    for idx, value in zip(rest, redact([tokens[j] for j in rest]), strict=True):
        tokens[idx] = value
    redacted = redact([value for _, _, value in extra])
    for (idx, prefix, _), value in zip(extra, redacted, strict=True):
        tokens[idx] = prefix + value
    return tokens


def redact_tree(value: Any) -> Any:
    """A manifest-like record with ``env`` mappings and ``command``/``argv``/``extra_args``
    lists redacted, a ``*_env`` string that is no variable name to store (``api_key_env``:
    ``stored_env_name``) masked and URL credentials in every string masked (``redact_url``),
    at any depth; everything else unchanged."""
    if isinstance(value, Mapping):
        if value.get("knob") == "extra_args":  # a knob mapping entry (adapters.base.MappedKnob)
            return _redact_extra_args_mapping(value)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key in ("env", "engine_env") and isinstance(item, Mapping):
                out[key] = redact_env(item)
            elif (key in ("command", "argv", "extra_args", "stop_argv")
                  and isinstance(item, list | tuple)
                  and all(isinstance(a, str | int | float) for a in item)):
                out[key] = redact_argv(item)
            elif (isinstance(key, str) and key.endswith("_env") and isinstance(item, str)
                  and not stored_env_name(item)):  # a key pasted for api_key_env's VAR
                out[key] = MASK
            else:
                out[key] = redact_tree(item)
        return out
    if isinstance(value, list | tuple):
        return [redact_tree(v) for v in value]
    if isinstance(value, str):
        return redact_url(value)
    return value


def _redact_extra_args_mapping(entry: Mapping[str, Any]) -> dict[str, Any]:
    out = {key: redact_tree(item) for key, item in entry.items()}
    if isinstance(out.get("value"), list | tuple):
        out["value"] = redact_argv(out["value"])
    if isinstance(out.get("flags"), list | tuple):
        flags = []
        for fragment in out["flags"]:
            try:
                flags.append(shlex.join(redact_argv(shlex.split(str(fragment)))))
            except ValueError:  # unbalanced quotes: mask it all rather than guess
                flags.append(MASK)
        out["flags"] = flags
    return out


def secret_values(*, env: Mapping[str, str] | None = None, argv: Sequence[Any] = (),
                  api_key_env: str | None = None, urls: Iterable[str | None] = (),
                  ) -> frozenset[str]:
    """The secret values of a run, to scrub from free text (logs, error messages): env values
    off the allow-list, secret flag values and URL credentials of ``argv``, the credentials of
    ``urls`` (a target or base URL), the API key in ``api_key_env``. Only those
    ``_scrubbable``."""
    values: set[str] = set()
    for key, value in (env or {}).items():
        if not safe_env_name(key):
            values.add(str(value))
    tokens = [str(a) for a in argv]
    for original, redacted in zip(tokens, _redact_argv_flags(tokens), strict=True):
        if original != redacted:
            values.update(_masked_parts(original, redacted))
    for text in (*tokens, *(u for u in urls if u)):
        values.update(url_secrets(text))
    api_key = os.environ.get(api_key_env) if api_key_env else None
    if api_key:
        values.add(api_key)
    return frozenset(v for v in values if _scrubbable(v))


def _masked_parts(original: str, redacted: str) -> Iterable[str]:
    """The values masked in one argv item: word by word in an item read as several words
    (``"--api-key k1 k2"`` -> ``k1``, ``k2``; ``_item_words``)."""
    words, masked = original.split(), redacted.split()
    if len(words) > 1 and len(words) == len(masked):
        for word, shown in zip(words, masked, strict=True):
            if word != shown:
                yield from _masked_part(word, shown)
        return
    yield from _masked_part(original, redacted)


def _masked_part(original: str, redacted: str) -> Iterable[str]:
    if redacted == MASK:
        yield original
        return
    head = redacted[: redacted.rfind(MASK)]
    if original.startswith(head):
        yield original[len(head):]


def _scrubbable(value: str) -> bool:
    """Whether a secret value is scrubbed from free text. ``_ALWAYS_SCRUB_LEN`` (8) characters
    or more: always, digits (``8675309123456789``) or not. Shorter: from ``_MIN_SCRUB_LEN``
    (3) on, unless it is a number (``512``, ``0.9``) or a boolean-like word (``true``,
    ``off``): masking those would garble every count and flag of a log. Such a short value is
    still redacted where it is stored (env, argv), only not searched for in text."""
    v = value.strip()
    if len(v) >= _ALWAYS_SCRUB_LEN:
        return True
    return (len(v) >= _MIN_SCRUB_LEN and not v.replace(".", "", 1).isdigit()
            and v.lower() not in _PLAIN_VALUES)


MIN_CUT_SECRET = 6  # characters of a secret's beginning that are masked wherever they are
_SCRUB_CHUNK = 1 << 20  # bytes a log is read in


class _Masker(Generic[AnyStr]):
    """Where the secrets of one set are in a text (str) or a log's bytes: at each place the
    longest run of a secret the text repeats there, the whole secret or a beginning of
    ``MIN_CUT_SECRET`` characters or more (a secret shorter than that: only whole); the
    places do not overlap, left to right. The one masking rule of ``scrub_text`` and
    ``scrub_files``.

    Linear in the secrets' length: a regex finds the secrets' heads (their first
    ``MIN_CUT_SECRET`` characters), then each secret with that head is compared with the text
    directly, as far as the two agree. (One regex alternative per beginning of a secret grew
    with the square of its length: seconds to compile for a 2 KB JWT.)

        secrets {"hf_secret123456"}, text "a hf_secre b hf_se"
        head    "hf_sec"  ──► at 2 the text agrees with the secret for 8 characters
        spans   (2, 10)       ("hf_se" at 13: shorter than a head, kept)
    """

    def __init__(self, secrets: frozenset[AnyStr]) -> None:
        by_head: dict[AnyStr, list[AnyStr]] = {}
        for secret in secrets:
            by_head.setdefault(secret[:MIN_CUT_SECRET], []).append(secret)
        # longest first: a whole short secret loses to the head of a longer one at one place
        heads = sorted(by_head, key=lambda h: (-len(h), h))
        joiner: Any = b"|" if isinstance(heads[0], bytes) else "|"
        self._heads: re.Pattern[AnyStr] = re.compile(joiner.join(re.escape(h) for h in heads))
        self._by_head: dict[AnyStr, list[AnyStr]] = by_head
        self.longest = max(len(s) for s in secrets)  # the longest span there can be

    def spans(self, text: AnyStr) -> Iterator[tuple[int, int]]:
        """(start, end) of each place to mask, left to right."""
        pos = 0
        while (found := self._heads.search(text, pos)) is not None:
            start, head = found.start(), found.group()
            if len(head) < MIN_CUT_SECRET:  # a short secret, whole
                end = found.end()
            else:
                end = start + max(_agreeing(text, start, secret, len(head))
                                  for secret in self._by_head[head])
            yield start, end
            pos = end

    def sub(self, mask: AnyStr, text: AnyStr) -> AnyStr:
        """``text`` with each span replaced by ``mask``."""
        parts: list[AnyStr] = []
        done = 0
        for start, end in self.spans(text):
            parts += [text[done:start], mask]
            done = end
        if not parts:
            return text
        parts.append(text[done:])
        return text[:0].join(parts)


def _agreeing(text: AnyStr, at: int, secret: AnyStr, known: int) -> int:
    """How many characters of ``secret`` ``text`` repeats from ``at`` on, the first ``known``
    known to agree. Bisected, each step comparing only the part not yet known to agree: the
    part halves each step, so the whole costs about twice the secret's length."""
    if text.startswith(secret, at):
        return len(secret)
    low, high = known, min(len(secret) - 1, len(text) - at)  # agrees for low, not past high
    while low < high:
        mid = (low + high + 1) // 2
        if text.startswith(secret[low:mid], at + low):
            low = mid
        else:
            high = mid - 1
    return low


@functools.lru_cache(maxsize=8)
def _masker(secrets: frozenset[Any]) -> _Masker[Any] | None:
    """One masker per set of secrets, kept: a replay scrubs every failed request's message
    with the same few."""
    return _Masker(secrets) if secrets else None


def _mask_pattern(secrets: Iterable[AnyStr]) -> _Masker[AnyStr] | None:
    """The masker of these secrets (the same object for the same set); None: nothing to
    mask."""
    return _masker(frozenset(s for s in secrets if s))


def scrub_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value replaced by ``***``, and any beginning of one of
    ``MIN_CUT_SECRET`` characters or more: an error body is kept only so long, and a server
    that echoes the key may have had it cut in two, the cut perhaps quoted after
    (``'...sk-LEAK'``). Half a key is still half a key. A URL's credentials are masked
    whether given or not (``redact_url``)."""
    text = redact_url(text)
    masker = _mask_pattern(secrets)
    return text if masker is None else masker.sub(MASK, text)


def _scrub_stream(src: BinaryIO, dst: BinaryIO, masker: _Masker[bytes], longest: int,
                  *, chunk_size: int = _SCRUB_CHUNK) -> bool:
    """Copy ``src`` to ``dst`` with every span of ``masker`` masked, ``chunk_size`` bytes at a
    time, exactly as masking the whole file at once would; returns whether anything was masked.

    A span is at most ``longest`` bytes. Spans that start more than ``longest`` bytes before
    the end of what has been read are whole, and are masked; the tail after them waits for the
    next chunk, so that a secret split across two reads is still found."""
    mask = MASK.encode()
    pending = b""
    changed = False
    while True:
        chunk = src.read(chunk_size)
        data = pending + chunk
        safe = len(data) if not chunk else max(0, len(data) - longest)
        out: list[bytes] = []
        done = 0
        for start, end in masker.spans(data):
            if start >= safe:
                break
            out += [data[done:start], mask]
            done = end
            changed = True
        cut = max(done, safe)
        out.append(data[done:cut])
        dst.write(b"".join(out))
        pending = data[cut:]
        if not chunk:
            return changed


def scrub_files(folder: Path, secrets: Iterable[str]) -> int:
    """Scrub the logs (``*.log``, ``*.txt``) directly in ``folder`` as ``scrub_text`` scrubs
    text, reading each in chunks whatever its size; returns how many changed. A file is
    replaced only when something in it was masked, by one with its mode (a server log is its
    owner's only: ``adapters.process``)."""
    masker = _mask_pattern(v.encode() for v in secrets)
    if masker is None:
        return 0
    changed = 0
    for path in sorted(Path(folder).iterdir()):
        if not path.is_file() or not path.name.endswith(_TEXT_SUFFIXES):
            continue
        tmp = path.with_name(path.name + ".scrub.tmp")
        try:
            with path.open("rb") as src, _same_mode(tmp, src) as dst:
                masked = _scrub_stream(src, dst, masker, masker.longest, chunk_size=_SCRUB_CHUNK)
            if masked:
                os.replace(tmp, path)
                changed += 1
        except OSError:
            pass  # a full disk must not turn scrubbing into a crash
        finally:
            tmp.unlink(missing_ok=True)
    return changed


def _same_mode(path: Path, like: BinaryIO) -> BinaryIO:
    """``path`` created (or truncated) for writing with the mode of the open file ``like``:
    owner-only from its first byte when ``like`` is (never the umask's wider default)."""
    mode = stat.S_IMODE(os.fstat(like.fileno()).st_mode)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode & 0o600)
    with contextlib.suppress(OSError):  # a file system without modes: owner-only at most
        os.fchmod(fd, mode)
    return os.fdopen(fd, "wb")
