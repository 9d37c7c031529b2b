"""The Gradio chat UI (see docs/ui.md). Gradio's usage analytics are switched off before it is
imported anywhere in this package: the app is offline and makes no call outside the machine."""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import rag  # noqa: E402, F401  (keeps JAX from preallocating a GPU: rag/__init__)
