"""``python -m harness.cli``: how launched servers (``serve reference``) are started."""

from harness.cli import run

run()
