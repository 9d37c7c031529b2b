"""The division-of-labour experiment: is MLM better for retrieval and CLM for generation?

``python -m evals.division_of_labor`` runs :func:`main`: one flag per field of
:class:`~evals.division_of_labor.presets.ExperimentConfig`, plus ``--json``. The rows, columns
and cached cells are described in the package docstring (evals/division_of_labor/__init__.py)
and in docs/division_of_labor.md.

CLI::

    python -m evals.division_of_labor --preset tiny --out artifacts/evals/dol-tiny
    python -m evals.division_of_labor --preset small --seeds 0 1 --out artifacts/evals/dol-small
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from evals.division_of_labor.experiment import Experiment
from evals.division_of_labor.presets import ExperimentConfig


def main(argv: list[str] | None = None) -> int:
    from evals.cli import EXPECTED_ERRORS, write_result
    from rag.dataclass_cli import config_from_args, dataclass_parser

    p = dataclass_parser("python -m evals.division_of_labor", __doc__, ExperimentConfig)
    p.add_argument("--json", action="store_true", help="print results.json on stdout")
    a = p.parse_args(argv)
    if not a.out:
        p.error("the following arguments are required: --out")
    cfg = config_from_args(ExperimentConfig, a)
    try:
        results = Experiment(cfg).run()
    except EXPECTED_ERRORS as e:
        traceback.print_exc(file=sys.stderr)
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_result(results, None, a.json)
    print(f"wrote {Path(a.out) / 'results.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
