"""What the training commands use when nothing else is named: default values only.

Why this module: from a fresh clone nothing has been chosen yet (no corpus, no output folder, no
tokenizer), and a command that stops to ask for three flags and a separate tokenizer run is not
one that "works as typed". So a run picks, and its first lines say what it picked:

- **corpus**: the project's ``docs/``, the demo document set that ``make demo`` ingests. It is
  found beside this package (the checkout holding ``pyproject.toml``, the rule ``rag.storage.paths``
  uses for ``$RAG_HOME``), so it resolves from any working directory; ``./docs`` when the package
  is installed outside a checkout.
- **out**: ``$RAG_HOME/models/<encoder|decoder>-<objective>-<preset>``, the names ``make models``
  uses, so the other commands find the model by name.
- **tokenizer**: ``$RAG_HOME/tokenizer`` when it exists and fits the preset (what
  ``training.tokenizer`` and ``make models`` write by default: an explicit tokenizer run wins);
  otherwise :func:`corpus_tokenizer_dir`, ``$RAG_HOME/tokenizer-<corpus key>-<vocab>``, a
  byte-level BPE trained for this corpus's file list on the first run and reused by every later
  run on the same files. The key hashes the sorted absolute file paths, so ``docs`` and
  ``./docs/`` share one tokenizer; the vocabulary is the preset's ``tokenizer_vocab`` (8,192 for
  tiny/small, 16,384 for base). The choice itself (which may mean training) is
  :func:`training.tokenizer.choose_tokenizer`.

Nothing here runs for flags that were given: an explicit ``--tokenizer`` that is missing is
still an error, never silently trained. The module imports nothing from ``training``, so the
config (``training.pretrain.config``), the tokenizer and the CLIs can all read their defaults here.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from rag.storage.paths import models_dir, rag_home

_PROJECT_ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_CHARS = (
    20_000_000  # text a corpus tokenizer trains on (make models' cap: merges converge)
)

# what --help prints as the default of flags whose dataclass default is a "choose for me" value
DEFAULT_HELP = {
    "corpus": "docs/ of this project, the demo document set",
    "out": "$RAG_HOME/models/<encoder|decoder>-<objective>-<preset>",
    "tokenizer": "$RAG_HOME/tokenizer if present, else $RAG_HOME/tokenizer-<corpus key>-<vocab>, "
    "trained on the first run and reused after",
    "init_from": "none: a random init",
}


def default_corpus() -> list[str]:
    """The demo document set: ``docs/`` of the checkout, else ``./docs``."""
    docs = _PROJECT_ROOT / "docs"
    if (_PROJECT_ROOT / "pyproject.toml").exists() and docs.is_dir():
        return [str(docs)]
    return [str(Path.cwd() / "docs")]


def default_out(objective: str, preset: str) -> str:
    """``$RAG_HOME/models/encoder-mlm-tiny`` and the like: make models' names (every objective
    but clm saves the encoder layout there)."""
    kind = "decoder" if objective == "clm" else "encoder"
    return str(models_dir() / f"{kind}-{objective}-{preset}")


def corpus_key(files: list[Path]) -> str:
    """A short hash of the sorted absolute file paths: same files, same tokenizer folder."""
    listing = "\n".join(sorted(str(f.resolve()) for f in files))
    return hashlib.sha256(listing.encode()).hexdigest()[:12]


def corpus_tokenizer_dir(files: list[Path], vocab: int) -> Path:
    """``$RAG_HOME/tokenizer-<corpus key>-<vocab>``: the tokenizer trained for these files."""
    return rag_home() / f"tokenizer-{corpus_key(files)}-{vocab}"


def default_docs_if_no_data(cfg: object, sources: tuple[str, ...], prog: str) -> bool:
    """When none of the config's data ``sources`` is set, train on the demo document set
    (``docs/``) and say so on stderr, so ``python -m training.finetune.contrastive`` or
    ``python -m training.finetune.lora`` bare works as typed. Returns whether it chose."""
    if any(getattr(cfg, name) for name in sources):
        return False
    cfg.docs = default_corpus()  # type: ignore[attr-defined]
    flags = ", ".join("--" + name.replace("_", "-") for name in sources)
    print(f"{prog}: no training data given ({flags}): using {cfg.docs[0]}", file=sys.stderr)  # type: ignore[attr-defined]
    return True
