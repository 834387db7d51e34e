"""``python -m harness.cli``: how launched servers (``serve reference``) are started."""

import sys

from harness.cli import main

sys.exit(main())
