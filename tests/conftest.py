"""Suite-wide setup.

Tests that press Ctrl-C on a child process need SIGINT to reach it. A shell that starts a job
in the background (`make test &`, some CI runners) starts it with SIGINT ignored, and an ignored
signal stays ignored in every child. Handling SIGINT in the test process itself makes each
child start with the default disposition again, as under an interactive shell.
"""

from __future__ import annotations

import signal

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
