"""What ``python -m training.pretrain --objective mlm`` uses when nothing else is named.

Why this module: from a fresh clone nothing has been chosen yet (no corpus, no output folder, no
tokenizer), and a command that stops to ask for three flags and a separate tokenizer run is not
one that "works as typed". So a run picks, and its first lines say what it picked:

- **corpus**: the project's ``docs/``, the demo document set that ``make demo`` ingests. It is
  found beside this package (the checkout holding ``pyproject.toml``, the rule ``rag.paths``
  uses for ``$RAG_HOME``), so it resolves from any working directory; ``./docs`` when the package
  is installed outside a checkout.
- **out**: ``$RAG_HOME/models/<encoder|decoder>-<objective>-<preset>``, the names ``make models``
  uses, so the other commands find the model by name.
- **tokenizer**: ``$RAG_HOME/tokenizer`` when it exists and fits the preset (what
  ``training.tokenizer`` and ``make models`` write by default: an explicit tokenizer run wins);
  otherwise ``$RAG_HOME/tokenizer-<corpus key>-<vocab>``, a byte-level BPE trained for this
  corpus's file list on the first run and reused by every later run on the same files. The key
  hashes the sorted absolute file paths, so ``docs`` and ``./docs/`` share one tokenizer; the
  vocabulary is the preset's ``tokenizer_vocab`` (8,192 for tiny/small, 16,384 for base).

Nothing here runs for flags that were given: an explicit ``--tokenizer`` that is missing is
still an error, never silently trained. The pretraining parser lives here too, because its
``--help`` has to print these same defaults.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rag.dataclass_cli import dataclass_parser
from rag.paths import models_dir, rag_home, tokenizer_dir
from training.config import ModelPreset, PretrainConfig, get_preset

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
    """``$RAG_HOME/models/encoder-mlm-tiny`` and the like: make models' names."""
    kind = "encoder" if objective == "mlm" else "decoder"
    return str(models_dir() / f"{kind}-{objective}-{preset}")


def corpus_key(files: list[Path]) -> str:
    """A short hash of the sorted absolute file paths: same files, same tokenizer folder."""
    listing = "\n".join(sorted(str(f.resolve()) for f in files))
    return hashlib.sha256(listing.encode()).hexdigest()[:12]


@dataclass
class TokenizerChoice:
    """Which tokenizer a run uses, and how it came to be chosen (for the first printed lines)."""

    path: Path
    how: str  # given (--tokenizer) | shared ($RAG_HOME/tokenizer) | reused | train
    note: str = ""  # e.g. why $RAG_HOME/tokenizer was passed over


def choose_tokenizer(given: str, files: list[Path], preset: ModelPreset) -> TokenizerChoice:
    """Decide the tokenizer folder without training anything (``how == "train"`` asks for it)."""
    if given:
        return TokenizerChoice(Path(given), "given")
    note, shared = "", tokenizer_dir()
    if (shared / "tokenizer.json").exists():
        from tokenizers import Tokenizer

        n = Tokenizer.from_file(str(shared / "tokenizer.json")).get_vocab_size()
        if n <= preset.max_vocab:
            return TokenizerChoice(shared, "shared")
        note = f"{shared} passed over: {n} tokens, preset {preset.name} takes {preset.max_vocab}"
    path = rag_home() / f"tokenizer-{corpus_key(files)}-{preset.tokenizer_vocab}"
    how = "reused" if (path / "tokenizer.json").exists() else "train"
    return TokenizerChoice(path, how, note)


def train_for_corpus(choice: TokenizerChoice, corpus: list[str], vocab: int) -> float:
    """Train the corpus tokenizer into a temporary sibling folder, then rename it into place:
    an interrupted run leaves nothing that a later run would "reuse", and torchrun ranks that
    all train at once race safely (the first rename wins, the others use its folder).
    Returns the seconds it took."""
    from training.tokenizer import train_tokenizer

    t0 = time.time()
    tmp = choice.path.with_name(f".{choice.path.name}.{os.getpid()}.tmp")
    train_tokenizer([Path(c) for c in corpus], vocab, tmp, max_chars=TOKENIZER_CHARS)
    try:
        tmp.rename(choice.path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (choice.path / "tokenizer.json").exists():
            raise
    return time.time() - t0


def tokenizer_line(choice: TokenizerChoice, vocab: int, seconds: float | None) -> str:
    """The header line naming the tokenizer and whether it was trained now or reused."""
    if choice.how == "given":
        return f"tokenizer: {choice.path} (--tokenizer), {vocab} tokens"
    if choice.how == "shared":
        return f"tokenizer: reused {choice.path} ($RAG_HOME/tokenizer), {vocab} tokens"
    if choice.how == "reused":
        return f"tokenizer: reused {choice.path} (trained earlier for these files), {vocab} tokens"
    return (
        f"tokenizer: trained {choice.path} for these files in {seconds or 0:.1f}s, {vocab} tokens "
        "(later runs on the same files reuse it)"
    )


def header_lines(
    cfg: PretrainConfig, given: PretrainConfig, n_files: int, device: str, world: int
) -> dict[str, str]:
    """The run's choices besides the tokenizer, keyed by what they describe. ``cfg`` is the
    resolved config, ``given`` the one the caller passed (empty fields were defaulted)."""
    p = get_preset(cfg.preset)
    default = " (default: the project's docs/)" if not given.corpus else ""
    steps = f"{cfg.max_steps} (the cosine lr schedule spans them)"
    if cfg.schedule == "time":
        steps = f"up to {cfg.max_steps} (the lr schedule follows the clock)"
    if cfg.max_minutes:
        steps += f", stop after {cfg.max_minutes:g} min"
    return {
        "corpus": f"corpus:    {' '.join(cfg.corpus)}{default}, {n_files} files",
        "out": f"out:       {cfg.out}{' (default)' if not given.out else ''}",
        "preset": f"preset:    {p.name} ({p.num_hidden_layers} layers x {p.hidden_size}), "
        f"seq {cfg.seq_len} x batch {cfg.batch_size}, peak lr {cfg.lr:g}",
        "device": f"device:    {device}" + (f" x {world} processes" if world > 1 else ""),
        "steps": f"steps:     {steps}",
    }


def say(line: str, rank: int = 0) -> None:
    """Header lines go to stderr (stdout stays the summary, JSON with --json); rank 0 only."""
    if rank == 0:
        print(line, file=sys.stderr, flush=True)


def announce(
    cfg: PretrainConfig,
    given: PretrainConfig,
    choice: TokenizerChoice,
    n_files: int,
    device: str,
    world: int,
    rank: int,
):
    """Print what the run chose (corpus, tokenizer, out, preset, device, steps), training the
    corpus tokenizer first when ``choice`` asks for it; returns the loaded tokenizer."""
    from training.tokenizer import load_tokenizer

    lines = header_lines(cfg, given, n_files, device, world)
    if choice.how != "train":
        tokenizer = load_tokenizer(choice.path)  # a missing --tokenizer fails before any output
    say(lines["corpus"], rank)
    seconds = None
    if choice.how == "train":
        vocab = get_preset(cfg.preset).tokenizer_vocab
        say(f"tokenizer: training byte-level BPE (up to {vocab} tokens) on these files ...", rank)
        seconds = train_for_corpus(choice, cfg.corpus, vocab)
        tokenizer = load_tokenizer(choice.path)
    say(tokenizer_line(choice, len(tokenizer), seconds), rank)
    if choice.note:
        say(f"           ({choice.note})", rank)
    for key in ("out", "preset", "device", "steps"):
        say(lines[key], rank)
    return tokenizer


# ---------------------------------------------------------------------------- CLI


def build_parser(description: str) -> argparse.ArgumentParser:
    """One flag per PretrainConfig field (rag.dataclass_cli: help from the field comments, each
    ending in its default, so ``--help`` says what a bare run will do), plus ``--json`` and
    ``--no-progress``. ``--objective`` is required: encoder or decoder is the one choice a run
    cannot guess."""
    p = dataclass_parser(
        "python -m training.pretrain",
        description,
        PretrainConfig,
        shown=DEFAULT_HELP,
        required=("objective",),
    )
    p.add_argument(
        "--json", action="store_true", help="print the run summary as JSON on stdout (default: off)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (default: off)")
    return p


def default_docs_if_no_data(cfg: object, sources: tuple[str, ...], prog: str) -> bool:
    """When none of the config's data ``sources`` is set, train on the demo document set
    (``docs/``) and say so on stderr, so ``python -m training.contrastive`` or
    ``python -m training.lora`` bare works as typed. Returns whether it chose."""
    if any(getattr(cfg, name) for name in sources):
        return False
    cfg.docs = default_corpus()  # type: ignore[attr-defined]
    flags = ", ".join("--" + name.replace("_", "-") for name in sources)
    print(f"{prog}: no training data given ({flags}): using {cfg.docs[0]}", file=sys.stderr)  # type: ignore[attr-defined]
    return True
