"""The division-of-labour experiment: is MLM better for retrieval and CLM for generation?

``python -m evals.division_of_labor`` runs :func:`main`: one flag per field of
:class:`~evals.division_of_labor.presets.ExperimentConfig`, plus ``--json``. The rows, columns
and cached cells are described in the package docstring (evals/division_of_labor/__init__.py)
and in docs/division_of_labor.md.

CLI::

    python -m evals.division_of_labor --preset tiny --out artifacts/evals/dol-tiny
    python -m evals.division_of_labor --preset small --seeds 0 1 --out artifacts/evals/dol-small
    python -m evals.division_of_labor --preset base --rows mlm15 clm --seeds 0 1 --jobs 4 \
        --out artifacts/evals/dol-base   # four workers on one GPU
"""

from __future__ import annotations

from pathlib import Path

from evals.division_of_labor.experiment import Experiment
from evals.division_of_labor.presets import ExperimentConfig


def main(argv: list[str] | None = None) -> int:
    """Exit 2 for a bad flag or missing data (one line, rag.cli), 1 when a step fails."""
    from rag.cli.flags import config_parser, run_config_cli

    parser = config_parser(
        "python -m evals.division_of_labor", __doc__, ExperimentConfig, required=("out",)
    )
    return run_config_cli(
        parser,
        ExperimentConfig,
        lambda cfg: Experiment(cfg).run(),
        argv,
        note=lambda cfg, res: (
            f"wrote {Path(cfg.out) / 'results.md'}"
            if cfg.report
            else f"cells of {' '.join(cfg.rows)}, seeds {cfg.seeds}: {len(res['left'])} pairs left"
        ),
    )


if __name__ == "__main__":
    raise SystemExit(main())
