"""``python -m rag.serve``: see :mod:`rag.serve.app`."""

from __future__ import annotations

import sys

from rag.serve.app import main

sys.exit(main())
