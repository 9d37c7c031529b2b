"""LoRA tuning of a causal LM into a grounded answerer: ``answer [i]`` from k numbered passages.

    python -m training.finetune.lora --model smollm2 --out artifacts/models/smollm2-lora \\
        --data ../shared/data/squad/squad-v1.1-dev-part.json --max-examples 300 --k-passages 3

``--data`` takes a SQuAD JSON file (examples built by :mod:`training.data.lora_data`, train articles
only) or JSONL files of prebuilt examples; ``--docs DIR...`` adds examples mined from the user's
own documents (:mod:`training.data.doc_qa_data`: heading → question, section lead → cited answer), a
``--doc-fraction`` share of ``--max-examples``. Any causal LM with a chat template works (Llama,
SmolLM2, Qwen2, our decoder): ``all-linear`` adapts every linear layer but the head; Llama and
Qwen2 both call theirs ``q_proj k_proj v_proj o_proj gate_proj up_proj down_proj``. The prompt is
the pipeline's (:mod:`rag.answer.prompt`) in the model's own chat template; the loss covers only the
assistant turn (answer, citation markers, end-of-turn token), never the prompt. Training is the
transformers Trainer over a peft LoRA model; the held-out SQuAD articles are scored before and
after (EM/F1, citation accuracy, refusal accuracy) by greedy generation.

``--prompt-format span`` tunes the reader-first prompt instead (:mod:`rag.answer.reader` found
the short answer; the decoder writes one to three sentences around it from that one passage,
ending ``[1]``). Its targets (``--span-targets distill``, the default) are the base model's own
greedy replies where they hold the span word for word and every claim word is in the passage
(:func:`training.finetune.lora_eval.span_reply_check`), else the passage's sentence holding the
span: rejection-sampled self-distillation, since no offline teacher writes better sentences, and
what it teaches is to stay in the passage and keep the span. ``make models`` trains this one
(``<decoder>-span-lora``, what ``--adapter auto`` picks).

Output: a peft adapter folder (adapter_config.json, adapter_model.safetensors, tokenizer,
run.json, train_log.jsonl, loss.png); ``--merge`` also writes ``<out>/merged``, a plain
AutoModelForCausalLM folder.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.answer.prompt import format_span_target
from rag.cli.flags import config_parser, run_config_cli
from rag.models import pick_profile, resolve_model
from rag.models.precision import torch_dtype
from rag.pipeline import SPAN_MAX_NEW_TOKENS
from training.data.lora_data import (
    span_examples,
    span_training_examples,
    squad_examples,
    training_examples,
)
from training.data.qa_example import QAExample, example_messages
from training.defaults import default_docs_if_no_data
from training.finetune.lora_eval import evaluate, generate_answers, shown_reply, span_reply_check
from training.finetune.recipe import (
    FinetuneConfig,
    check_training_precision,
    finetune_run,
    training_precision,
)

log = logging.getLogger("training.finetune.lora")


@dataclass
class LoraTrainConfig(FinetuneConfig):
    """Everything a LoRA run depends on (the training loop's settings:
    :class:`~training.finetune.recipe.FinetuneConfig`); saved as run.json beside the adapter."""

    model: str = "smollm2"  # causal LM folder, alias (smollm2) or artefact name
    # passages: k numbered passages -> "answer [i]" or the refusal; span: the reader-first prompt,
    # one passage + the reader's short answer -> one to three sentences holding it, ending [1]
    prompt_format: str = "passages"
    # span format only: distill (the base model's own replies that keep the span and stay in the
    # passage, the passage's sentence elsewhere) | sentence (always the passage's sentence)
    span_targets: str = "distill"
    data: list[str] = field(default_factory=list)  # SQuAD JSON (built on the fly) or example JSONL
    docs: list[str] = field(default_factory=list)  # document folders/files for doc-style examples
    doc_fraction: float = 0.5  # share of doc examples when both --data and --docs are given
    eval_data: str | None = None  # SQuAD JSON for held-out eval (default: the --data SQuAD file)
    r: int = 8  # LoRA rank
    alpha: int = 16  # LoRA scaling numerator (scale = alpha / r)
    dropout: float = 0.05  # LoRA dropout
    # adapt only the top N transformer layers (0 = all): backpropagation then stops below them,
    # which roughly halves a CPU step at N = half the layers
    top_layers: int = 0
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])  # all-linear or names
    batch_size: int = 2  # examples per forward pass
    grad_accum: int = 4  # forward passes per optimiser step
    lr: float = 2e-4  # peak learning rate (linear warmup then decay)
    warmup_ratio: float = 0.05  # fraction of steps spent warming up
    k_passages: int = 3  # passages per prompt (gold + k-1 BM25 distractors)
    refusal_fraction: float = 0.15  # share of examples with no answer-bearing passage
    # written to run.json: the refusal gate threshold rag uses with this adapter (rag.answer.refusal);
    # choose it with evals.refusal_sweep on SQuAD train articles; None = greedy refusals
    refusal_threshold: float | None = None  # the gate threshold saved for rag (rag.answer.refusal)
    max_examples: int = 300  # training examples in all, SQuAD + docs (0 = every one available)
    passage_words: int = 0  # trim SQuAD passages to this many words around the answer (0 = whole)
    doc_passage_words: int = 180  # trim doc sections to this many words (0 = whole section)
    max_length: int = 1024  # examples longer than this many tokens are skipped
    eval: bool = True  # score held-out questions before and after tuning
    eval_examples: int = 100  # held-out examples (fixed by seed; same refusal share)
    eval_batch_size: int = 8  # generation batch size
    max_new_tokens: int = 32  # generation budget per answer
    merge: bool = False  # also write <out>/merged: base weights with the adapter folded in
    # base weights: auto | fp32 | bf16 (rag.models.precision's words; int8 is refused), auto =
    # bf16 on CUDA or a CPU with bf16 units
    precision: str = "auto"
    logging_steps: int = 5  # log the loss every this many optimiser steps


# ---------------------------------------------------------------------------- data → tokens


def encode_example(tokenizer: Any, ex: QAExample, max_length: int) -> dict[str, list[int]] | None:
    """input_ids/labels for one example, labels -100 on the prompt; None when too long.

    The prompt is rendered with ``add_generation_prompt=True``, exactly as at inference; the
    full chat (with the assistant turn) must extend it, and the extension is the supervised part.
    """
    msgs = example_messages(ex)
    prompt = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(
        msgs + [{"role": "assistant", "content": ex.target}], tokenize=False
    )
    if not full.startswith(prompt):
        raise ValueError(
            "the chat template does not render the prompt as a prefix of the full chat"
        )
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    t_ids = tokenizer(full[len(prompt) :].rstrip("\n"), add_special_tokens=False)["input_ids"]
    if len(p_ids) + len(t_ids) > max_length:
        return None
    return {"input_ids": p_ids + t_ids, "labels": [-100] * len(p_ids) + t_ids}


class PadCollator:
    """Right-pads input_ids (pad id) and labels (-100) to the longest in the batch."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, rows: list[dict[str, list[int]]]) -> dict[str, Any]:
        import torch

        n = max(len(r["input_ids"]) for r in rows)
        ids = [r["input_ids"] + [self.pad_id] * (n - len(r["input_ids"])) for r in rows]
        labels = [r["labels"] + [-100] * (n - len(r["labels"])) for r in rows]
        mask = [[1] * len(r["input_ids"]) + [0] * (n - len(r["input_ids"])) for r in rows]
        return {
            "input_ids": torch.tensor(ids),
            "labels": torch.tensor(labels),
            "attention_mask": torch.tensor(mask),
        }


# ---------------------------------------------------------------------------- training


def load_base(name: str, device: str, precision: str = "fp32"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch_dtype(training_precision(precision, device))
    path = resolve_model(name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise ValueError(
            f"--model {name}: the tokenizer has no chat template (apply_chat_template needs one)"
        )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.to(device)
    return model, tokenizer


def top_layer_ids(model: Any, n: int) -> list[int] | None:
    """Indices of the top ``n`` decoder layers (None = every layer, for n = 0)."""
    total = model.config.num_hidden_layers
    if not 0 <= n <= total:
        raise ValueError(f"--top-layers must be in [0, {total}], not {n}")
    return list(range(total - n, total)) if n else None


def lora_targets(model: Any, target_modules: list[str], top_layers: int) -> str | list[str]:
    """peft's ``target_modules``. ``all-linear`` is passed as peft's own string, except with
    ``--top-layers``: peft refuses ``layers_to_transform`` with a string target, so the names
    of the linear layers are listed instead, every one but the output head (what all-linear
    picks)."""
    import torch

    if target_modules != ["all-linear"]:
        return target_modules
    if not top_layers:
        return "all-linear"
    head = model.get_output_embeddings()
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not head
        }
    )


PROMPT_FORMATS = ("passages", "span")
SPAN_TARGETS = ("distill", "sentence")
# Tokens a reply around a reader span may take: the pipeline's own cap.
SPAN_NEW_TOKENS = SPAN_MAX_NEW_TOKENS


def distill_span_targets(
    model: Any, tokenizer: Any, examples: list[QAExample], cfg: LoraTrainConfig
) -> int:
    """Rejection-sampled self-distillation for reader-first examples: the base model's greedy
    reply (cut at its ``[1]``) becomes an example's target where it holds the span, stays in
    the passage (:func:`~training.finetune.lora_eval.span_reply_check`) and ended by itself (at
    ``[1]`` or its end of turn, not at the token cap); the others keep the passage's sentence.
    Returns how many targets were replaced."""
    todo = [e for e in examples if e.kind == "span"]
    replies = generate_answers(model, tokenizer, todo, cfg, SPAN_NEW_TOKENS)
    replaced = 0
    for ex, reply in zip(todo, replies):
        kept, grounded = span_reply_check(reply, ex)
        shown = shown_reply(reply)
        ended = shown != reply or (
            tokenizer is not None
            and len(tokenizer(reply, add_special_tokens=False)["input_ids"]) < SPAN_NEW_TOKENS - 1
        )
        if kept and grounded and ended:
            ex.target = format_span_target(shown)
            replaced += 1
    return replaced


def train_lora(cfg: LoraTrainConfig) -> dict[str, Any]:
    """Build examples, score zero-shot, tune LoRA, save (and merge), score again; the summary."""
    default_docs_if_no_data(cfg, ("data", "docs"), "training.finetune.lora")
    return fit(cfg)[2]


def fit(cfg: LoraTrainConfig) -> tuple[Any, Any, dict[str, Any]]:
    """:func:`train_lora`, also returning (peft model, tokenizer); with ``--merge`` the model is
    the merged plain model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainingArguments

    if cfg.prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"--prompt-format must be passages or span, not {cfg.prompt_format!r}")
    if cfg.span_targets not in SPAN_TARGETS:
        raise ValueError(f"--span-targets must be distill or sentence, not {cfg.span_targets!r}")
    span = cfg.prompt_format == "span"
    with finetune_run(cfg, "lora") as run:
        # SQuAD train articles and/or --docs, mixed; built before the model loads
        if span:
            examples = span_training_examples(
                cfg.data, cfg.docs, cfg.max_examples, cfg.doc_fraction, cfg.seed
            )
        else:
            examples = training_examples(
                cfg.data, cfg.docs, cfg.max_examples, cfg.doc_fraction, cfg.k_passages,
                cfg.refusal_fraction, cfg.seed, cfg.passage_words, cfg.doc_passage_words,
            )  # fmt: skip
        model, tokenizer = load_base(cfg.model, run.device, cfg.precision)
        bf16 = next(model.parameters()).dtype == torch.bfloat16  # adapters stay fp32 (peft's)
        distilled = 0
        if span and cfg.span_targets == "distill":
            distilled = distill_span_targets(model, tokenizer, examples, cfg)
            log.info("%d of %d targets are the base model's own replies", distilled, len(examples))
        rows = [
            r
            for r in (encode_example(tokenizer, e, cfg.max_length) for e in examples)
            if r is not None
        ]
        if not rows:
            raise ValueError(f"no training example fits --max-length {cfg.max_length}")
        skipped = len(examples) - len(rows)
        log.info("%d training examples (%d skipped as too long)", len(rows), skipped)

        eval_src = cfg.eval_data or next((f for f in cfg.data if f.endswith(".json")), None)
        heldout = []
        if cfg.eval and eval_src and span:
            heldout = span_examples(eval_src, "dev", cfg.eval_examples, seed=1234)
        elif cfg.eval and eval_src:
            heldout = squad_examples(
                eval_src, "dev", cfg.eval_examples, cfg.k_passages, cfg.refusal_fraction, seed=1234
            )
        budget = SPAN_NEW_TOKENS if span else None
        before = evaluate(model, tokenizer, heldout, cfg, budget) if heldout else {}
        log.info("zero-shot: %s", {k: v for k, v in before.items() if k != "samples"})

        lcfg = LoraConfig(
            r=cfg.r,
            lora_alpha=cfg.alpha,
            lora_dropout=cfg.dropout,
            target_modules=lora_targets(model, cfg.target_modules, cfg.top_layers),
            task_type="CAUSAL_LM",
            layers_to_transform=top_layer_ids(model, cfg.top_layers),
        )
        model = get_peft_model(model, lcfg)
        n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        args = run.training_args(
            TrainingArguments,
            gradient_accumulation_steps=cfg.grad_accum,
            bf16=bf16,
            remove_unused_columns=False,  # rows are token lists the collator pads
        )
        collator = PadCollator(tokenizer.pad_token_id)
        run.train(Trainer, args, model, rows, data_collator=collator)
        model.save_pretrained(str(run.out))
        tokenizer.save_pretrained(str(run.out))

        after = evaluate(model, tokenizer, heldout, cfg, budget) if heldout else {}
        log.info("tuned: %s", {k: v for k, v in after.items() if k != "samples"})
        if cfg.merge:
            model = model.merge_and_unload()
            model.save_pretrained(str(run.out / "merged"))
            tokenizer.save_pretrained(str(run.out / "merged"))
        summary = run.finish(
            f"LoRA {Path(cfg.model).name} (answer tokens only)",
            {
                # the k-passage prompt profile rag uses with the adapter (rag.models.pick_profile):
                # the one trained on, or for the span format the base model's own (the adapter
                # also serves the decoder-over-k-passages fallback, untrained there)
                "profile": pick_profile(cfg.model) if span else "plain",
                "prompt_format": cfg.prompt_format,
                "n_distilled_targets": distilled,
                "refusal_threshold": cfg.refusal_threshold,  # rag.models.pick_refusal_threshold
                "base_model": str(resolve_model(cfg.model)),
                "n_train_examples": len(rows),
                "n_train_refusals": sum(not e.answerable for e in examples),
                "n_train_doc_examples": sum(e.kind == "doc" for e in examples),
                "trainable_params": n_trainable,
                "before": before,
                "after": after,
            },
        )
    return model, tokenizer, summary


QWEN_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


QWEN_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _recipe(
    model: str, out: str | Path, data: Path, preset: str, device: str, threads: int, **fields: Any
) -> LoraTrainConfig:
    """What both make-models recipes share: SQuAD train articles + linux-doc (never python-docs
    nor docs/), r = 16 on every projection, merged; on the CPU presets the top half of the layers,
    batch 1 x 4 at lr 5e-4, on ``base`` (GPU) every layer, batch 8 x 2 at lr 2e-4. ``fields``
    are the recipe's own settings."""
    import json

    cpu = preset in ("tiny", "small")
    layers = json.loads((resolve_model(model) / "config.json").read_text())["num_hidden_layers"]
    return LoraTrainConfig(
        model=model,
        out=str(out),
        data=[str(data / "squad" / "squad-v1.1-dev-part.json")],
        docs=[str(data / "corpus" / "linux-doc")],
        doc_fraction=0.2,
        top_layers=layers // 2 if cpu else 0,
        r=16,
        alpha=32,
        target_modules=QWEN_MODULES,
        batch_size=1 if cpu else 8,
        grad_accum=4 if cpu else 2,
        lr=5e-4 if cpu else 2e-4,
        merge=True,
        device=device,
        threads=threads,
        **fields,
    )


def preset_config(
    model: str, out: str | Path, data: Path, preset: str, device: str, threads: int = 0
) -> LoraTrainConfig:
    """The k-passage recipe (``make models``' until the reader existed; evals/answers_table.sh
    and docs/answering.md measure it): SQuAD train-article questions with k=5
    shuffled passages (gold among BM25 distractors, 20% with no answer → the refusal) plus 20%
    documentation-style examples from the corpus (never python-docs: its questions are the
    held-out docs QA set). CPU presets: 360 examples, passages trimmed to 50 words, the top half
    of the layers adapted; ``base`` (GPU): 3,000 examples with whole paragraphs, every layer.
    Its timing: docs/training.md."""
    cpu = preset in ("tiny", "small")
    return _recipe(
        model, out, data, preset, device, threads,
        doc_passage_words=80 if cpu else 180,
        k_passages=5,
        refusal_fraction=0.2,
        # chosen for this CPU recipe on Qwen 0.5B by evals.refusal_sweep (docs/answering.md);
        # other models and the GPU recipe need their own sweep
        refusal_threshold=0.6 if cpu and model == "qwen2.5-coder-0.5b" else None,
        max_examples=360 if cpu else 3000,
        passage_words=50 if cpu else 0,
        eval_examples=40 if cpu else 300,
    )  # fmt: skip


def span_preset_config(
    model: str, out: str | Path, data: Path, preset: str, device: str, threads: int = 0
) -> LoraTrainConfig:
    """The ``make models`` recipe: the reader-first prompt (``prompt_format="span"``), SQuAD
    train-article questions on their gold paragraph plus 20% linux-doc section questions,
    distilled targets. CPU presets: 240 examples; ``base`` (GPU): 2,000 examples. Measured (the
    distillation included): docs/training.md, the reader-first adapter."""
    cpu = preset in ("tiny", "small")
    return _recipe(
        model, out, data, preset, device, threads,
        prompt_format="span",
        span_targets="distill",
        max_examples=240 if cpu else 2000,
        eval_examples=40 if cpu else 200,
        max_new_tokens=SPAN_NEW_TOKENS,
    )  # fmt: skip


# ---------------------------------------------------------------------------- CLI


def _report(summary: dict) -> str:
    lines = [
        f"{key}: {summary['before'][key]} -> {summary['after'][key]}"
        for key in (
            "em",
            "f1",
            "citation_accuracy",
            "refusal_accuracy",
            "span_kept",
            "grounded",
            "kept_and_grounded",
            "mean_words",
        )
        if key in summary["before"]
    ]
    n, steps = summary["n_train_examples"], summary["steps"]
    lines.append(f"saved {summary['out']} ({n} examples, {steps} steps)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = config_parser(
        "python -m training.finetune.lora",
        __doc__,
        LoraTrainConfig,
        choices={"prompt_format": PROMPT_FORMATS, "span_targets": SPAN_TARGETS},
    )
    return run_config_cli(
        parser,
        LoraTrainConfig,
        train_lora,
        argv,
        check=lambda cfg: check_training_precision(cfg.precision),
        report=_report,
        logs_to_stderr=True,
    )


if __name__ == "__main__":
    sys.exit(main())
