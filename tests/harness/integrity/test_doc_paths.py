"""Every source file the documentation names is there: docs/metrics.md cited
harness/replay.py, harness/sse_client.py, harness/http_pool.py and harness/prompts.py long
after they moved under harness/live/, and a reader looked for them in vain."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# a repository path in backticks or a link: harness/..., adapters/..., bench/..., scenarios/...
_PATH = re.compile(r"(?<![\w/.-])((?:harness|adapters|bench|scenarios|tests)/[\w./-]+"
                   r"\.(?:py|yaml|jsonl|json|csv)\b)")


# a line citing another repository's file names a path of that repository
_OTHER_REPO = re.compile(r"`(?:NVIDIA|vllm-project|huggingface|ggml-org|ggerganov)/[\w.-]+`"
                         r"|github\.com")
EXAMPLES = {"scenarios/mine.yaml"}  # a user's own file, in an example of an error message


def _documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
            REPO / "scenarios" / "README.md"]


def test_every_source_path_the_docs_name_exists() -> None:
    missing = []
    for doc in _documents():
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if _OTHER_REPO.search(line):
                continue
            for path in _PATH.findall(line):
                if not (REPO / path).exists() and path not in EXAMPLES:
                    missing.append(f"{doc.relative_to(REPO)}:{number}: {path}")
    assert missing == []
