"""Data of the division-of-labour experiment: paths (from ../shared/data unless given) and the
two retrieval dev sets every model is scored on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from evals.division_of_labor.presets import COLUMNS, ROWS, ExperimentConfig, ExperimentPreset
from rag.evaluation.datasets import RetrievalDataset
from rag.storage.paths import shared_data_dir

REPO = Path(__file__).resolve().parents[2]


def debian_corpus(data: Path | None) -> Path | None:
    """training.data.debian_corpus's folder: ``corpus-debian`` in the shared data (where the GPU
    pack unpacks it) or in $RAG_HOME (where the builder writes it); None when neither has it."""
    from training.data.debian_corpus import DEFAULT_NAME, default_out

    for folder in ([data / DEFAULT_NAME] if data else []) + [default_out()]:
        if (folder / "MANIFEST.json").is_file():
            return folder
    return None


def default_corpus(preset: str, data: Path | None) -> list[str]:
    """The pretraining corpus a preset reads unless ``--corpus`` is given: the test fixtures
    (tiny), the Python docs (small: ~3M tokens, a CPU budget), and for base (98M-token budgets
    on a GPU) the Debian documentation corpus with the shared corpus and the Python docs, ~45M
    tokens, so a row reads it about twice and does not memorise it (docs/division_of_labor.md)."""
    if preset == "tiny":
        return [str(REPO / "tests" / "fixtures" / "corpus")]
    if data is None:
        return []
    if preset != "base":
        return [str(data / "python-docs")]
    debian = debian_corpus(data)
    if debian is None:
        raise FileNotFoundError(
            "--corpus: the base preset pretrains on the Debian documentation corpus, not built "
            "yet (python -m training.data.debian_corpus), or give --corpus"
        )
    return [str(debian), str(data / "corpus"), str(data / "python-docs")]


def resolve_paths(cfg: ExperimentConfig, data: Path | None = None) -> ExperimentConfig:
    """Fill data paths from ``data`` (default: ../shared/data) and the corpus from the preset;
    errors name the flag."""
    data = data or shared_data_dir()
    c = replace(
        cfg,
        corpus=cfg.corpus or default_corpus(cfg.preset, data),
        scifact=cfg.scifact or (str(data / "scifact") if data else ""),
        squad=cfg.squad or (str(data / "squad" / "squad-v1.1-dev-part.json") if data else ""),
        wikitext=cfg.wikitext or (str(data / "wikitext-2" / "wiki.valid.tokens") if data else ""),
    )
    for flag, value in (("--scifact", c.scifact), ("--squad", c.squad), ("--wikitext", c.wikitext)):
        if not value or not Path(value).exists():
            raise FileNotFoundError(
                f"{flag} {value or '(unset)'}: not found (give the path or set RAG_SHARED_DATA)"
            )
    if not c.corpus:
        raise FileNotFoundError("--corpus: no pretraining corpus given and no shared data found")
    if unknown := [r for r in c.rows if r not in ROWS]:
        raise ValueError(f"--rows: unknown row(s) {unknown}; have {list(ROWS)}")
    if c.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, not {c.jobs}")
    if unknown := [col for col in c.columns if col not in COLUMNS]:
        raise ValueError(f"--columns: unknown column(s) {unknown}; have {list(COLUMNS)}")
    return c


def subsample(ds: RetrievalDataset, n_queries: int, n_docs: int, seed: int = 0) -> RetrievalDataset:
    """At most ``n_queries`` queries and ``n_docs`` documents (every relevant one kept), seeded."""
    import random

    rng = random.Random(seed)
    qids = sorted(ds.queries)
    if n_queries and n_queries < len(qids):
        qids = sorted(rng.sample(qids, n_queries))
    small = ds.subset(qids)
    if n_docs and n_docs < len(ds.corpus):
        keep = {d for q in qids for d in ds.qrels.get(q, {})}
        rest = sorted(set(ds.corpus) - keep)
        keep |= set(rng.sample(rest, max(0, min(len(rest), n_docs - len(keep)))))
        small.corpus = {d: ds.corpus[d] for d in ds.corpus if d in keep}
    return small


def dev_sets(cfg: ExperimentConfig, p: ExperimentPreset) -> dict[str, RetrievalDataset]:
    """The two retrieval dev sets every model is scored on (fixed splits, same subsample)."""
    from evals.retrieval import load_eval_dataset

    sets = {
        "scifact_dev": load_eval_dataset(cfg.scifact, "train", "dev"),
        "squad_dev": load_eval_dataset(f"squad:{cfg.squad}", queries="dev"),
    }
    return {k: subsample(v, p.eval_queries, p.eval_docs) for k, v in sets.items()}


def reading_squad(squad: str, out: Path, n_train_articles: int, seed: int = 0) -> str:
    """The SQuAD file the reading column trains and scores on: ``squad`` itself, or (with
    ``n_train_articles``) a copy holding every dev article and that many train articles drawn by
    ``seed``, written once to ``out``. Why: training.finetune.reader mines BM25 distractors for every
    train-article question before it samples its ``max_questions`` (about 40 s per reader on
    two cores), which the tiny preset cannot afford eight times. The split is unchanged: dev is
    the named article list (rag.evaluation.datasets.squad_split), all of it kept."""
    import json
    import random

    from rag.evaluation.datasets import squad_split

    if not n_train_articles:
        return squad
    if not out.exists():
        train, dev = squad_split(squad)
        keep = set(dev) | set(random.Random(seed).sample(train, min(n_train_articles, len(train))))
        data = json.loads(Path(squad).read_text())
        data["data"] = [a for a in data["data"] if a["title"] in keep]
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(out)
    return str(out)
