"""Bits per byte of left-to-right prediction, for CLM decoders and MLM encoders alike.

Bits per byte is vocabulary independent: the summed negative log-likelihood of the evaluated
tokens (in bits) divided by the UTF-8 bytes those tokens cover, so models with different
tokenizers (ours, SmolLM2's) land on one scale.

- CLM: standard sliding-window evaluation (as the transformers perplexity guide): windows of
  ``context`` tokens moved by ``context // 2``; each token is scored once, with at least half a
  window of left context (except at the start).
- MLM used left to right: to score token ``t`` the encoder sees ``<cls> x[<t] <mask> <sep>`` and
  the probability it gives ``x[t]`` at the mask, which is how an MLM generates by iterative
  masking. One forward pass per token (batched), so keep ``--max-tokens`` modest for MLMs.

Both objectives see at most ``context`` tokens of left context. The first token of the text is
predicted from the bos/cls token when the tokenizer has one, otherwise it is not scored and its
bytes are left out.

CLI::

    python -m evals.lm --model DIR --text ../shared/data/wikitext-2/wiki.valid.tokens --max-tokens 4096
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from rag.cli.flags import config_parser, run_config_cli
from rag.cli.progress import track


@dataclass
class LMEvalConfig:
    """Settings of one bits-per-byte measurement (all saved in the output JSON)."""

    model: str = ""  # model folder or alias (rag.models.resolve_model)
    text: list[str] = field(default_factory=list)  # text files, joined with blank lines
    objective: str = "auto"  # auto (from the model config) | clm | mlm
    max_tokens: int = 4096  # score at most this many tokens from the start of the text
    context: int = 0  # max left context in tokens; 0 = the model's position limit (capped 512)
    batch_size: int = 16  # MLM: prefixes scored per forward pass
    device: str = "auto"  # auto | cpu | cuda


def detect_objective(config) -> str:
    """``clm`` for a causal-LM config, ``mlm`` otherwise (from ``architectures`` / ``is_decoder``)."""
    from rag.models import lm_objective

    return lm_objective(config) or ("clm" if getattr(config, "is_decoder", False) else "mlm")


def load_lm(name: str, objective: str = "auto", device: str = "cpu"):
    """(model, tokenizer, objective) for a folder or alias, on ``device``, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    from rag.models import resolve_model

    path = resolve_model(name)
    config = AutoConfig.from_pretrained(path)
    if objective == "auto":
        objective = detect_objective(config)
    cls = AutoModelForCausalLM if objective == "clm" else AutoModelForMaskedLM
    model = cls.from_pretrained(path, dtype=torch.float32).to(device).eval()
    return model, AutoTokenizer.from_pretrained(path), objective


def _context_limit(model, context: int) -> int:
    limit = getattr(model.config, "max_position_embeddings", None) or 512
    return min(context or 512, limit)


def _tokens_and_bytes(tokenizer, text: str, max_tokens: int) -> tuple[list[int], int, bool]:
    """(token ids, UTF-8 bytes they cover, whether a bos/cls prefix scores the first token)."""
    # Tokenize a generous prefix only (a token is rarely longer than 16 characters); the whole
    # text when the prefix turns out too short.
    for piece in (text[: max_tokens * 16], text):
        enc = tokenizer(piece, add_special_tokens=False, return_offsets_mapping=True)
        if len(enc["input_ids"]) > max_tokens or piece is text:
            break
    ids, offsets = enc["input_ids"][:max_tokens], enc["offset_mapping"][:max_tokens]
    if not ids:
        raise ValueError("the text has no tokens")
    end = offsets[-1][1]
    has_start = (tokenizer.bos_token_id or tokenizer.cls_token_id) is not None
    start = 0 if has_start else offsets[0][1]
    return ids, len(text[start:end].encode("utf-8")), has_start


@torch.no_grad()
def clm_nll(model, ids: list[int], bos: int | None, context: int, device: str) -> tuple[float, int]:
    """Summed NLL (nats) and count of tokens scored, sliding windows with stride context/2."""
    seq = ([bos] if bos is not None else []) + ids
    stride = max(1, context // 2)
    total, count, scored_to = 0.0, 0, 1  # seq[0] is never scored
    for begin in track(range(0, len(seq), stride), "clm bpb", unit="window"):
        end = min(begin + context, len(seq))
        window = torch.tensor([seq[begin:end]], device=device)
        logits = model(input_ids=window).logits[0, :-1].float()
        targets = window[0, 1:]
        nll = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
        first_new = max(scored_to, begin + 1) - (begin + 1)  # skip tokens scored already
        total += nll[first_new:].sum().item()
        count += len(targets) - first_new
        scored_to = end
        if end == len(seq):
            break
    return total, count


@torch.no_grad()
def mlm_nll(
    model, tokenizer, ids: list[int], context: int, batch_size: int, device: str
) -> tuple[float, int]:
    """Summed NLL (nats) of each token predicted at a mask after its left prefix."""
    if tokenizer.mask_token_id is None:
        raise ValueError(
            "this tokenizer has no mask token, so the model cannot be scored as an MLM"
        )
    cls = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    head = [cls] if cls is not None else []
    tail = [sep] if sep is not None else []
    room = context - len(head) - len(tail) - 1
    start = 0 if head else 1  # without a cls the first token has nothing to be predicted from
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    total, count = 0.0, 0
    positions = list(range(start, len(ids)))
    for b in track(range(0, len(positions), batch_size), "mlm bpb", unit="batch"):
        batch = positions[b : b + batch_size]
        rows = [head + ids[max(0, t - room) : t] + [tokenizer.mask_token_id] + tail for t in batch]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), pad, device=device)
        attention = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        mask_at = []
        for i, r in enumerate(rows):
            input_ids[i, : len(r)] = torch.tensor(r, device=device)
            attention[i, : len(r)] = 1
            mask_at.append(len(r) - len(tail) - 1)
        picked = _logits_at(model, input_ids, attention, mask_at)
        targets = torch.tensor([ids[t] for t in batch], device=device)
        total += torch.nn.functional.cross_entropy(picked, targets, reduction="sum").item()
        count += len(batch)
    return total, count


def _logits_at(
    model, input_ids: torch.Tensor, attention: torch.Tensor, at: list[int]
) -> torch.Tensor:
    """Logits at position ``at[i]`` of row ``i``: (rows, vocab).

    ModernBERT's ``sparse_prediction`` runs the prediction head only where ``labels`` is set,
    which skips the vocabulary projection at every other position (most of an MLM's scoring
    cost at small sizes); other MLMs compute every position and the rows are picked after.
    """
    rows = torch.arange(len(at), device=input_ids.device)
    cols = torch.tensor(at, device=input_ids.device)
    if getattr(model, "sparse_prediction", None) is None:
        logits = model(input_ids=input_ids, attention_mask=attention).logits
        return logits[rows, cols].float()
    labels = torch.full_like(input_ids, getattr(model, "sparse_pred_ignore_index", -100))
    labels[rows, cols] = input_ids[rows, cols]  # any id: only its position matters
    sparse, model.sparse_prediction = model.sparse_prediction, True
    try:  # logits come back only at the labelled positions, in row order: (rows, vocab)
        return model(input_ids=input_ids, attention_mask=attention, labels=labels).logits.float()
    finally:
        model.sparse_prediction = sparse


def bits_per_byte(
    model,
    tokenizer,
    text: str,
    objective: str,
    max_tokens: int = 4096,
    context: int = 0,
    batch_size: int = 16,
    device: str = "cpu",
) -> dict[str, float]:
    """Bits per byte (and tokens, bytes, nats per token) of ``text``'s first ``max_tokens``."""
    ids, n_bytes, has_start = _tokens_and_bytes(tokenizer, text, max_tokens)
    ctx = _context_limit(model, context)
    if objective == "clm":
        bos = tokenizer.bos_token_id if has_start else None
        if bos is None and has_start:
            bos = tokenizer.cls_token_id
        nats, count = clm_nll(model, ids, bos, ctx, device)
    elif objective == "mlm":
        nats, count = mlm_nll(model, tokenizer, ids, ctx, batch_size, device)
    else:
        raise ValueError(f"objective must be clm or mlm, not {objective!r}")
    return {
        "bits_per_byte": nats / math.log(2) / max(n_bytes, 1),
        "nats_per_token": nats / max(count, 1),
        "tokens_scored": count,
        "bytes": n_bytes,
        "context": ctx,
    }


def read_texts(paths: list[str]) -> str:
    """The text files joined by blank lines; a missing file raises FileNotFoundError naming it."""
    parts = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise FileNotFoundError(f"--text {p}: no such file")
        parts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n\n".join(parts)


def evaluate(cfg: LMEvalConfig) -> dict:
    """Load the model, read the text, measure; returns the settings and the numbers."""
    from rag.models import pick_device

    if cfg.objective not in ("auto", "clm", "mlm"):
        raise ValueError(f"--objective must be auto, clm or mlm, not {cfg.objective!r}")
    device = pick_device(cfg.device)
    text = read_texts(cfg.text)
    model, tokenizer, objective = load_lm(cfg.model, cfg.objective, device)
    t0 = time.perf_counter()
    out = bits_per_byte(
        model, tokenizer, text, objective, cfg.max_tokens, cfg.context, cfg.batch_size, device
    )
    return {
        "config": {**asdict(cfg), "objective": objective, "device": device},
        **out,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _summary(cfg: LMEvalConfig, result: dict) -> str:
    return (
        f"{cfg.model} ({result['config']['objective']}): {result['bits_per_byte']:.4f} bits/byte "
        f"over {result['tokens_scored']} tokens / {result['bytes']} bytes"
    )


def main(argv: list[str] | None = None) -> int:
    parser = config_parser(
        "python -m evals.lm", __doc__, LMEvalConfig, out_file=True, required=("model", "text")
    )
    return run_config_cli(parser, LMEvalConfig, evaluate, argv, note=_summary)


if __name__ == "__main__":
    raise SystemExit(main())
