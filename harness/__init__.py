"""batchlab's harness: traces in, timelines through, metrics and reports out.

The harness never knows which engine it drives (see ``adapters``)."""
