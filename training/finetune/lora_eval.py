"""Held-out scoring of a LoRA-tuned answerer inside ``training.finetune.lora``: greedy answers in
left-padded batches, then EM/F1, citation accuracy and refusal accuracy on the held-out SQuAD
examples (the same metrics as :mod:`evals.qa`, without the retrieval step)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from rag.answer.prompt import parse_citations
from training.data.qa_example import QAExample, example_messages

# ---------------------------------------------------------------------------- generation + scoring


def stop_ids(tokenizer: Any) -> list[int]:
    """Token ids that end an assistant turn: eos plus ChatML's <|im_end|> when present."""
    ids = {tokenizer.eos_token_id}
    for tok in ("<|im_end|>", "<|end|>", "<|eot_id|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return sorted(i for i in ids if i is not None)


def generate_answers(
    model: Any,
    tokenizer: Any,
    examples: Sequence[QAExample],
    cfg: Any,
    max_new_tokens: int | None = None,
) -> list[str]:
    """Greedy answers for ``examples`` (left-padded batches, each in its own prompt format:
    :func:`training.data.qa_example.example_messages`); ``max_new_tokens`` overrides the
    config's."""
    import torch
    from tqdm import tqdm

    tokenizer.padding_side = "left"
    device = next(model.parameters()).device
    outs: list[str] = []
    model.eval()
    for i in tqdm(range(0, len(examples), cfg.eval_batch_size), desc="generate", file=sys.stderr):
        batch = examples[i : i + cfg.eval_batch_size]
        prompts = [
            tokenizer.apply_chat_template(
                example_messages(e), add_generation_prompt=True, tokenize=False
            )
            for e in batch
        ]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            device
        )
        with torch.no_grad():
            gen = model.generate(
                **enc,
                max_new_tokens=max_new_tokens or cfg.max_new_tokens,
                do_sample=False,
                eos_token_id=stop_ids(tokenizer),
                pad_token_id=tokenizer.pad_token_id,
            )
        outs += tokenizer.batch_decode(
            gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
        )
    tokenizer.padding_side = "right"
    return [o.strip() for o in outs]


def score_answers(examples: Sequence[QAExample], answers: Sequence[str]) -> dict[str, Any]:
    """EM/F1 and citation accuracy over answerable examples; refusal accuracy over the rest."""
    from rag.evaluation.metrics import citation_correct, exact_match, f1_score

    em = f1 = cite = refused_ok = wrong_refusals = 0.0
    n_ans = n_unans = 0
    for ex, ans in zip(examples, answers):
        parsed = parse_citations(ans, len(ex.passages))
        if ex.answerable:
            n_ans += 1
            em += exact_match(parsed.text, ex.answers)
            f1 += f1_score(parsed.text, ex.answers)
            cite += citation_correct(parsed.cited, ex.cited)
            wrong_refusals += parsed.refused
        else:
            n_unans += 1
            refused_ok += parsed.refused
    a, u = max(n_ans, 1), max(n_unans, 1)
    return {
        "em": round(100 * em / a, 2),
        "f1": round(100 * f1 / a, 2),
        "citation_accuracy": round(100 * cite / a, 2),
        "refusal_accuracy": round(100 * refused_ok / u, 2),
        "false_refusals": round(100 * wrong_refusals / a, 2),
        "n_answerable": n_ans,
        "n_unanswerable": n_unans,
    }


def shown_reply(reply: str) -> str:
    """A reader-first reply as the pipeline keeps it: up to its first ``[1]``, where decoding
    stops (:data:`rag.pipeline.SPAN_CITATION`)."""
    from rag.pipeline import SPAN_CITATION

    return reply.split(SPAN_CITATION, 1)[0]


def span_reply_check(reply: str, ex: QAExample) -> tuple[bool, bool]:
    """Whether a reply to a reader-first example (``kind="span"``), cut where it first cites
    ``[1]`` (the pipeline stops decoding there), (holds the short answer word for word,
    normalised as SQuAD does; is grounded: one to three sentences, each with every claim word in
    the passage, :func:`rag.answer.support.support` = 1). A refusal is neither."""
    from rag.answer.support import split_sentences, support
    from rag.evaluation.metrics import normalize_answer

    parsed = parse_citations(shown_reply(reply), 1)
    if parsed.refused or not parsed.text.strip():
        return False, False
    kept = normalize_answer(ex.answers[0]) in normalize_answer(parsed.text)
    sentences = split_sentences(parsed.text)
    grounded = 0 < len(sentences) <= 3 and all(
        (v := support(s, ex.passages[0], ex.question)) is None or v >= 1.0 for s in sentences
    )
    return kept, grounded


def score_span_answers(examples: Sequence[QAExample], replies: Sequence[str]) -> dict[str, Any]:
    """Reader-first replies: the share that hold the short answer (``span_kept``; the pipeline
    shows the passage's own sentence in place of the others), that stay in the passage
    (``grounded``), that do both (``kept_and_grounded``), that end by citing ``[1]``, and their
    mean length in words (the cut at ``[1]``)."""
    checks = [span_reply_check(r, e) for e, r in zip(examples, replies)]
    n = max(len(checks), 1)
    words = [len(shown_reply(r).split()) for r in replies]
    return {
        "span_kept": round(100 * sum(k for k, _ in checks) / n, 2),
        "grounded": round(100 * sum(g for _, g in checks) / n, 2),
        "kept_and_grounded": round(100 * sum(k and g for k, g in checks) / n, 2),
        "cites_1": round(100 * sum(shown_reply(r) != r for r in replies) / n, 2),
        "mean_words": round(sum(words) / n, 1),
        "n_span": len(checks),
    }


def evaluate(
    model: Any,
    tokenizer: Any,
    examples: Sequence[QAExample],
    cfg: Any,
    max_new_tokens: int | None = None,
) -> dict[str, Any]:
    """Greedy replies to ``examples`` scored as their format asks: reader-first examples by
    :func:`score_span_answers`, k-passage ones by :func:`score_answers`; five samples kept."""
    answers = generate_answers(model, tokenizer, examples, cfg, max_new_tokens)
    spans = bool(examples) and all(e.kind == "span" for e in examples)
    scores = score_span_answers(examples, answers) if spans else score_answers(examples, answers)
    scores["samples"] = [
        {"question": e.question, "gold": e.target, "answer": a}
        for e, a in zip(examples[:5], answers)
    ]
    return scores
