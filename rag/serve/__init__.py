"""The OpenAI-compatible HTTP server (``python -m rag.serve``): the app, the wire format, the
HTTP plumbing and the process state."""
