"""Train the byte-level BPE tokenizer that the MLM encoder and the CLM decoder share.

Why byte-level BPE (and not WordPiece): one vocabulary has to serve both objectives. Byte-level
BPE never produces an unknown token (every UTF-8 byte is in the base alphabet), decodes back to
the exact input text (the decoder must generate code, paths and punctuation verbatim), and makes
bits per byte a plain function of the loss: bits/byte = loss_nats * tokens / (bytes * ln 2).
WordPiece lower-cases or maps unseen characters to [UNK], which a generator cannot afford.
The training itself is the `tokenizers` library; what is ours is the special-token layout, the
chat template and the per-objective post-processor.

Special tokens (ids fixed in this order): ``<pad>`` 0, ``<unk>`` 1, ``<s>`` 2 (cls and bos),
``</s>`` 3 (sep and eos), ``<mask>`` 4. The shared folder adds ``<s> … </s>`` around every
sequence (what the encoder saw in pretraining); :func:`for_objective` returns the decoder's
variant that adds only ``<s>`` in front, so ``generate()`` on ``tok(prompt)`` continues the prompt
instead of starting a new document.

CLI::

    python -m training.tokenizer                       # docs/ -> $RAG_HOME/tokenizer, 8,192 tokens
    python -m training.tokenizer --corpus ../shared/data/python-docs --vocab-size 16384 --out DIR

``training.pretrain`` uses ``$RAG_HOME/tokenizer`` when no ``--tokenizer`` is given (and trains
one for its corpus when that folder is absent: :func:`choose_tokenizer`), so this command is
optional.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rag.documents import load_documents
from rag.storage.paths import tokenizer_dir
from training.defaults import TOKENIZER_CHARS, corpus_tokenizer_dir, default_corpus
from training.pretrain.config import ModelPreset

PAD, UNK, BOS, EOS, MASK = "<pad>", "<unk>", "<s>", "</s>", "<mask>"
SPECIAL_TOKENS = [PAD, UNK, BOS, EOS, MASK]

# ChatML-like, built from the existing special tokens: each turn is "<s>role\ncontent</s>\n".
# Generation stops at </s> (the eos). Used by the LoRA fine-tune and the RAG generator.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<s>' + message['role'] + '\n' + message['content'] + '</s>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant\n' }}{% endif %}"
)


class TokenizerError(ValueError):
    """Bad tokenizer input (empty corpus, vocabulary too small, missing folder)."""


def iter_corpus_texts(corpus: list[Path]) -> Iterator[str]:
    """Texts of every supported document under ``corpus`` (through rag.documents)."""
    docs, errors = load_documents(corpus)
    for e in errors:
        print(f"skipped {e}", file=sys.stderr)
    if not docs:
        raise TokenizerError(f"no readable documents under {', '.join(map(str, corpus))}")
    for d in docs:
        yield d.text


def wrap(tok: Tokenizer, add_eos: bool = True) -> PreTrainedTokenizerFast:
    """A transformers tokenizer around a trained ``tokenizers`` object, with our special tokens,
    the chat template, and ``<s> … </s>`` (encoder, add_eos) or ``<s> …`` (decoder) added."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        cls_token=BOS,
        sep_token=EOS,
        mask_token=MASK,
        add_bos_token=True,
        add_eos_token=add_eos,
        model_max_length=8192,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def for_objective(tokenizer: PreTrainedTokenizerFast, objective: str) -> PreTrainedTokenizerFast:
    """The shared tokenizer set up for ``objective``: mlm adds ``<s> … </s>``, clm only ``<s>``."""
    return wrap(
        Tokenizer.from_str(tokenizer.backend_tokenizer.to_str()), add_eos=objective == "mlm"
    )


def train_tokenizer(
    corpus: list[Path],
    vocab_size: int,
    out: Path | None = None,
    min_frequency: int = 2,
    max_chars: int | None = None,
) -> PreTrainedTokenizerFast:
    """Train byte-level BPE on the documents under ``corpus`` and save it to ``out`` (if given).

    ``max_chars`` caps how much text the trainer sees: BPE merges converge long before the whole
    development corpus is read, and the cap keeps ``make models`` quick on a CPU (its size and
    timing: docs/pretraining.md).
    """
    if vocab_size < len(SPECIAL_TOKENS) + 256 + 1:
        raise TokenizerError(
            f"--vocab-size {vocab_size} is too small: byte-level BPE needs at least "
            f"{len(SPECIAL_TOKENS) + 257} (256 bytes + {len(SPECIAL_TOKENS)} special tokens + merges)"
        )
    texts: list[str] = []
    total = 0
    for text in iter_corpus_texts([Path(p) for p in corpus]):
        texts.append(text)
        total += len(text)
        if max_chars is not None and total >= max_chars:
            break
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    fast = wrap(tok)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        fast.save_pretrained(str(out))
        meta = {"vocab_size": len(fast), "documents": len(texts), "chars": total}
        meta["corpus"] = [str(p) for p in corpus]
        (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n")
    return fast


def load_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer folder, with a clear error when it is missing."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not (path / "tokenizer.json").exists():
        raise TokenizerError(
            f"--tokenizer {path}: no tokenizer.json there; train one with "
            f"`python -m training.tokenizer --corpus DIR --vocab-size 8192 --out {path}`"
        )
    return AutoTokenizer.from_pretrained(str(path))


# ---------------------------------------------------------------------------- a run's tokenizer


@dataclass
class TokenizerChoice:
    """Which tokenizer a run uses, and how it came to be chosen (for the first printed lines)."""

    path: Path
    how: str  # given (--tokenizer) | shared ($RAG_HOME/tokenizer) | reused | train
    note: str = ""  # e.g. why $RAG_HOME/tokenizer was passed over


def choose_tokenizer(given: str, files: list[Path], preset: ModelPreset) -> TokenizerChoice:
    """Decide the tokenizer folder without training anything (``how == "train"`` asks for it):
    ``given``, else ``$RAG_HOME/tokenizer`` when it fits the preset, else the corpus's own
    (:func:`training.defaults.corpus_tokenizer_dir`)."""
    if given:
        return TokenizerChoice(Path(given), "given")
    note, shared = "", tokenizer_dir()
    if (shared / "tokenizer.json").exists():
        n = Tokenizer.from_file(str(shared / "tokenizer.json")).get_vocab_size()
        if n <= preset.max_vocab:
            return TokenizerChoice(shared, "shared")
        note = f"{shared} passed over: {n} tokens, preset {preset.name} takes {preset.max_vocab}"
    path = corpus_tokenizer_dir(files, preset.tokenizer_vocab)
    how = "reused" if (path / "tokenizer.json").exists() else "train"
    return TokenizerChoice(path, how, note)


def train_for_corpus(choice: TokenizerChoice, corpus: list[str], vocab: int) -> float:
    """Train the corpus tokenizer into a temporary sibling folder, then rename it into place:
    an interrupted run leaves nothing that a later run would "reuse", and torchrun ranks that
    all train at once race safely (the first rename wins, the others use its folder).
    Returns the seconds it took."""
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


def main(argv: list[str] | None = None) -> int:
    from rag.cli import OneLineParser, run_cli

    p = OneLineParser(prog="python -m training.tokenizer", description=__doc__.split("\n")[0])
    p.add_argument(
        "--corpus",
        nargs="+",
        type=Path,
        default=None,
        help="folders/files of text (default: docs/ of this project, the demo document set)",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=8192,
        help="target vocabulary size; 8192 fits every preset (default: %(default)s)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="output folder (default: $RAG_HOME/tokenizer)"
    )
    p.add_argument(
        "--min-frequency",
        type=int,
        default=2,
        help="minimum pair count for a merge (default: %(default)s)",
    )
    p.add_argument(
        "--max-chars", type=int, default=None, help="cap on training characters (default: none)"
    )
    p.add_argument(
        "--json", action="store_true", help="print a JSON summary on stdout (default: off)"
    )

    def run(args: argparse.Namespace) -> int:
        corpus = args.corpus or [Path(c) for c in default_corpus()]
        out = args.out or tokenizer_dir()
        t0 = time.time()
        tok = train_tokenizer(corpus, args.vocab_size, out, args.min_frequency, args.max_chars)
        summary = {"out": str(out), "vocab_size": len(tok), "seconds": round(time.time() - t0, 1)}
        print(json.dumps(summary) if args.json else f"tokenizer ({len(tok)} tokens) -> {out}")
        return 0

    return run_cli(p, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
