"""Tiny models and data for the fine-tuning tests (pairs, contrastive, LoRA).

Tiny random models (2 layers x 64) over a byte-level BPE tokenizer with a ChatML chat template,
built in about a second; a synthetic SQuAD file with one held-out article (``Normans``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = [
    "python",
    "file",
    "open",
    "read",
    "write",
    "line",
    "loop",
    "list",
    "dict",
    "set",
    "string",
    "bytes",
    "module",
    "import",
    "class",
    "function",
    "return",
    "value",
    "error",
    "raise",
    "exception",
    "context",
    "manager",
    "iterator",
    "generator",
    "thread",
    "process",
    "socket",
    "server",
    "client",
    "request",
    "response",
    "header",
    "cache",
    "index",
    "vector",
    "query",
    "passage",
]

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rag.answer.prompt import REFUSAL, SYSTEM_PROMPT

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[CLS]", "[SEP]", "[MASK]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [SYSTEM_PROMPT, REFUSAL, " ".join(WORDS), "Passages: Question: [1] [2] [3]"]
    tok.train_from_iterator(corpus * 5, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    fast.chat_template = CHATML
    return fast


def tiny_bert_config(tok, **overrides):
    """The 2-layer, 64-wide BERT every tiny encoder and cross-encoder of the tests uses."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        **overrides,
    )


def save_tiny_encoder(path: Path, seed: int = 0) -> Path:
    """A plain HF BERT folder (no modules.json): the contrastive CLI must wrap it."""
    from transformers import BertModel

    tok = build_tokenizer()
    torch.manual_seed(seed)
    BertModel(tiny_bert_config(tok)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def tiny_sentence_transformer(folder: Path, seed: int = 0, max_seq_length: int = 32):
    """:func:`save_tiny_encoder` (``seed``) as a mean-pooled, normalised SentenceTransformer."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    save_tiny_encoder(folder, seed)
    tr = Transformer(str(folder), max_seq_length=max_seq_length)
    return SentenceTransformer(modules=[tr, Pooling(64, "mean"), Normalize()], device="cpu")


def save_tiny_decoder(path: Path, seed: int = 0) -> Path:
    """A plain HF Llama causal LM folder (smollm2's architecture) with a chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def tiny_pretrain_config(out: Path, tokenizer_dir: Path, objective: str = "mlm", **kw):
    """A tiny-preset PretrainConfig on tests/fixtures/corpus, CPU, one thread: 12 steps of 4 x 32
    tokens, held-out loss every 6, checkpoints every 4 (``kw`` overrides any field)."""
    from training.pretrain.config import PretrainConfig

    base = dict(
        objective=objective,
        preset="tiny",
        corpus=[str(Path(__file__).parent / "fixtures" / "corpus")],
        out=str(out),
        tokenizer=str(tokenizer_dir),
        max_steps=12,
        seq_len=32,
        batch_size=4,
        eval_every=6,
        eval_batches=1,
        save_every=4,
        log_every=2,
        heldout_fraction=0.25,
        device="cpu",
        threads=1,
    )
    base.update(kw)
    return PretrainConfig(**base)


def write_tiny_squad(path: Path) -> Path:
    """Five articles x 3 paragraphs x 2 questions; ``Normans`` is a held-out (dev) article."""
    titles = ["Normans", "Alpha_topic", "Beta_topic", "Gamma_topic", "Delta_topic"]
    data = []
    for a, title in enumerate(titles):
        paragraphs = []
        for p in range(3):
            w = [WORDS[(a * 7 + p * 3 + i) % len(WORDS)] for i in range(12)]
            answer, tool = f"{title.split('_')[0].lower()}{p}x", f"tool{a}{p}"
            context = (
                f"The {w[0]} of {title} is {answer}. "
                + " ".join(w)
                + f". It uses {w[5]} with {tool}."
            )
            qas = [
                {
                    "id": f"{a}-{p}-0",
                    "question": f"What is the {w[0]} of {title}?",
                    "answers": [{"text": answer}],
                },
                {
                    "id": f"{a}-{p}-1",
                    "question": f"What does {title} use with {w[5]}?",
                    "answers": [{"text": tool}],
                },
            ]
            paragraphs.append({"context": context, "qas": qas})
        data.append({"title": title, "paragraphs": paragraphs})
    path.write_text(json.dumps({"version": "1.1", "data": data}))
    return path


def write_pairs_file(path: Path, n: int = 64, seed: int = 0) -> Path:
    """Easy synthetic pairs: a word trio -> a sentence containing it."""
    import random

    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n):
            w = rng.sample(WORDS, 6)
            row = {"anchor": " ".join(w[:3]), "positive": " ".join(w[:3] + w[3:]) + f" item {i}"}
            f.write(json.dumps(row) + "\n")
    return path


def save_tiny_cross_encoder(path: Path, seed: int = 0, initializer_range: float = 0.2) -> Path:
    """A randomly initialised one-logit BERT saved as a sentence-transformers CrossEncoder folder
    (what ``python -m training.finetune.rerank`` writes), without training. ``initializer_range``
    larger than BERT's 0.02 spreads its scores over passages (at 0.02 they differ by ~1e-4)."""
    from sentence_transformers import CrossEncoder
    from transformers import BertForSequenceClassification

    tok = build_tokenizer()
    torch.manual_seed(seed)
    cfg = tiny_bert_config(tok, num_labels=1, initializer_range=initializer_range)
    hf = path.with_name(path.name + "-hf")
    BertForSequenceClassification(cfg).save_pretrained(hf)
    tok.save_pretrained(hf)
    CrossEncoder(str(hf), device="cpu", local_files_only=True).save(str(path))
    return path


def span_recipe_drift(argv: list[str], tmp_path: Path, preset: str, skip: set[str]) -> dict:
    """Fields where ``training.finetune.lora`` flags (a script's spelled-out recipe) differ from
    ``training.finetune.lora.span_preset_config(..., preset)`` for a 24-layer model; ``skip`` names
    the fields the script sets from its own paths."""
    from rag.cli.flags import config_from_args, config_parser
    from training.finetune.lora import (
        PROMPT_FORMATS,
        SPAN_TARGETS,
        LoraTrainConfig,
        span_preset_config,
    )

    parser = config_parser(
        "t",
        "",
        LoraTrainConfig,
        choices={"prompt_format": PROMPT_FORMATS, "span_targets": SPAN_TARGETS},
    )
    got = config_from_args(LoraTrainConfig, parser.parse_args(argv))
    model = tmp_path / "qwen"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 24}))
    want = span_preset_config(str(model), "out", Path("data"), preset, "auto", 2)
    return {
        k: (getattr(got, k), getattr(want, k))
        for k in vars(want)
        if k not in skip and getattr(got, k) != getattr(want, k)
    }
