"""``python -m evals.division_of_labor``: the experiment's command line
(:func:`evals.division_of_labor.run.main`)."""

from evals.division_of_labor.run import main

if __name__ == "__main__":
    raise SystemExit(main())
