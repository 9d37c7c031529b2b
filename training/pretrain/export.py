"""Save a pretrained model as a folder every consumer can load.

``AutoModelForMaskedLM`` / ``AutoModelForCausalLM`` read ``config.json`` + ``model.safetensors``;
the tokenizer files go beside them (the encoder's adds ``<s> … </s>``, the decoder's only
``<s>``); the encoder also gets the three small sentence-transformers files (modules.json,
sentence_bert_config.json, 1_Pooling/config.json, mean pooling) so ``SentenceTransformer(DIR)``
builds the intended pipeline instead of guessing one.

The objectives that train the encoder layout with causal steps too (``antlm``, ``prefixlm``:
training.pretrain.objectives) are saved twice: the encoder layout in ``out`` (retrieval, reading)
and the same weights in the decoder layout in ``out/decoder`` (:func:`save_decoder_copy`: bits per
byte, generation, LoRA), converted exactly by training.pretrain.init_from.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from training.pretrain.config import DECODER_SUBDIR
from training.tokenizer import for_objective


def save_model_folder(model, tokenizer, objective: str, out: Path, max_seq_length: int) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if objective == "clm":
        gc = model.generation_config
        gc.bos_token_id, gc.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
        gc.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out))
    for_objective(tokenizer, objective).save_pretrained(str(out))
    if objective == "mlm":
        write_sentence_transformers_files(out, model.config.hidden_size, max_seq_length)


def write_sentence_transformers_files(out: Path, dim: int, max_seq_length: int) -> None:
    modules = [
        {
            "idx": 0,
            "name": "0",
            "path": "",
            "type": "sentence_transformers.base.modules.transformer.Transformer",
        },
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
        },
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    st = {"max_seq_length": max_seq_length, "do_lower_case": False}
    (out / "sentence_bert_config.json").write_text(json.dumps(st, indent=2) + "\n")
    pooling = {"embedding_dimension": dim, "pooling_mode": "mean", "include_prompt": True}
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")


def save_decoder_copy(model, tokenizer, out: Path, max_seq_length: int) -> Path:
    """Save an encoder-layout ``model`` also as a ModernBertDecoderForCausalLM folder in
    ``out/decoder`` (the decoder tokenizer, generation config); returns that folder."""
    from training.pretrain.model import convert_model

    folder = Path(out) / DECODER_SUBDIR
    save_model_folder(convert_model(model, "clm"), tokenizer, "clm", folder, max_seq_length)
    return folder


def save_converted_folder(src: Path, out: Path, layout: str, max_seq_length: int) -> Path:
    """A saved MLM or CLM folder re-saved in ``layout`` (``mlm`` / ``clm``) in ``out``, with the
    tokenizer set up for that layout; returns ``out``."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    from training.pretrain.init_from import source_objective
    from training.pretrain.model import convert_model
    from training.tokenizer import load_tokenizer

    cls = AutoModelForCausalLM if source_objective(src) == "clm" else AutoModelForMaskedLM
    model = cls.from_pretrained(str(src), dtype=torch.float32)
    save_model_folder(
        convert_model(model, layout), load_tokenizer(Path(src)), layout, out, max_seq_length
    )
    return Path(out)
