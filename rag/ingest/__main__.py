"""``python -m rag.ingest``: see :mod:`rag.ingest.cli`."""

from __future__ import annotations

import sys

from rag.ingest.cli import main

sys.exit(main())
