"""batchlab's harness: traces in, timelines through, metrics and reports out.

The harness never knows which engine it drives (see ``adapters``)."""

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it from here)
