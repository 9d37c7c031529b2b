"""Cached experiment cells: each finished result is one JSON file, so a run resumes.

Several processes may share one folder (``--jobs``: a worker per row and seed): a cell is
written under a name of its process's own and renamed into place, so none sees another's half.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from evals.division_of_labor.steps import StepUnavailable


class Cells:
    """A folder of finished results: ``get(name, fn)`` runs ``fn`` only when the name is new."""

    def __init__(self, root: Path):
        self.root = root / "cells"
        self.root.mkdir(parents=True, exist_ok=True)
        self.skipped: dict[str, str] = {}

    def path(self, name: str) -> Path:
        return self.root / (name.replace("/", "__") + ".json")

    def has(self, name: str) -> bool:
        return self.path(name).exists()

    def peek(self, name: str) -> dict | None:
        """The cell's cached value, None when it has not run."""
        p = self.path(name)
        return json.loads(p.read_text()) if p.exists() else None

    def drop(self, name: str) -> None:
        """Forget a cell (its next ``get`` runs it again)."""
        self.path(name).unlink(missing_ok=True)

    def get(self, name: str, fn: Callable[[], dict]) -> dict:
        p = self.path(name)
        if p.exists():
            return json.loads(p.read_text())
        t0 = time.perf_counter()
        try:
            value = fn()
        except StepUnavailable as e:
            value = {"skipped": str(e)}  # not cached: reruns once the step exists
            self.skipped[name] = str(e)
            print(f"[{name}] skipped: {e}", file=sys.stderr)
            return value
        value["seconds"] = round(time.perf_counter() - t0, 1)
        tmp = p.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(value, indent=2))
        os.replace(tmp, p)
        print(f"[{name}] done in {value['seconds']}s", file=sys.stderr)
        return value

    def all(self) -> dict[str, dict]:
        return {
            p.stem.replace("__", "/"): json.loads(p.read_text())
            for p in sorted(self.root.glob("*.json"))
        }
