"""Build the paired ModernBERT encoder (MLM) and decoder (CLM) from one preset.

Both come from transformers: ``ModernBertForMaskedLM`` (bidirectional attention, alternating
global / sliding-window layers) and ``ModernBertDecoderForCausalLM`` (the same blocks with a
causal mask and a KV cache for ``generate()``). Sizes, norms, rotary settings and the tokenizer's
special ids are identical, so the attention mask and the objective are the only differences.
"""

from __future__ import annotations

from typing import Any

from transformers import (
    ModernBertConfig,
    ModernBertDecoderConfig,
    ModernBertDecoderForCausalLM,
    ModernBertForMaskedLM,
    PreTrainedModel,
)

from training.pretrain.config import LAYOUT, ConfigError, ModelPreset, get_preset

# backbone_kwargs' keys: what a converted model copies from the config it is converted from
_BACKBONE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
    "local_attention",
    "global_attn_every_n_layers",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "cls_token_id",
    "sep_token_id",
    "tie_word_embeddings",
)


def backbone_kwargs(preset: ModelPreset, vocab_size: int, tokenizer: Any) -> dict:
    """Config fields shared by both models."""
    if vocab_size > preset.max_vocab:
        raise ConfigError(
            f"--tokenizer vocabulary ({vocab_size} tokens) does not fit preset {preset.name} "
            f"(at most {preset.max_vocab}); train a smaller tokenizer or pick a larger preset"
        )
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "mask_token_id"):
        if getattr(tokenizer, name, None) is None:
            raise ConfigError(
                f"--tokenizer lacks a {name.removesuffix('_id')} (train it with training.tokenizer)"
            )
    # round the embedding table up to a multiple of 64 (faster matmuls on GPU); ids above the
    # tokenizer's vocabulary are never produced as inputs and never receive a label.
    padded = (vocab_size + 63) // 64 * 64
    return dict(
        vocab_size=padded,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        max_position_embeddings=preset.max_position_embeddings,
        local_attention=preset.local_attention,
        global_attn_every_n_layers=preset.global_attn_every_n_layers,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        tie_word_embeddings=True,
    )


def build_model(
    objective: str,
    preset: ModelPreset | str,
    vocab_size: int,
    tokenizer: Any,
    attn_implementation: str = "sdpa",
) -> PreTrainedModel:
    """A freshly initialised ModernBertForMaskedLM (``mlm``, and ``antlm`` / ``prefixlm``,
    which train the encoder layout: training.pretrain.objectives) or ModernBertDecoderForCausalLM
    (``clm``) of the preset's size, with the tokenizer's special ids in its config."""
    if isinstance(preset, str):
        preset = get_preset(preset)
    if objective not in LAYOUT:
        raise ConfigError(f"--objective must be one of {', '.join(LAYOUT)}, not {objective!r}")
    return _model_for(
        LAYOUT[objective], backbone_kwargs(preset, vocab_size, tokenizer), attn_implementation
    )


def _model_for(layout: str, kw: dict, attn_implementation: str) -> PreTrainedModel:
    if layout == "mlm":
        config = ModernBertConfig(**kw)
        config._attn_implementation = attn_implementation
        return ModernBertForMaskedLM(config)
    config = ModernBertDecoderConfig(**kw)
    config._attn_implementation = attn_implementation
    return ModernBertDecoderForCausalLM(config)


def convert_model(model: PreTrainedModel, layout: str) -> PreTrainedModel:
    """The same weights in the other layout (``mlm``: ModernBertForMaskedLM, ``clm``:
    ModernBertDecoderForCausalLM), converted exactly by training.pretrain.init_from; a model already
    in ``layout`` is returned as is."""
    from training.pretrain.init_from import clm_to_mlm_state_dict, mlm_to_clm_state_dict

    is_mlm = isinstance(model, ModernBertForMaskedLM)
    if (layout == "mlm") == is_mlm:
        return model
    kw = {k: getattr(model.config, k) for k in _BACKBONE_KEYS}
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    target = _model_for(layout, kw, impl)
    convert = mlm_to_clm_state_dict if is_mlm else clm_to_mlm_state_dict
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    target.load_state_dict(convert(state), strict=True)
    return target.to(next(model.parameters()).device)


def count_parameters(model: PreTrainedModel) -> dict[str, int]:
    """Total and non-embedding parameter counts (tied weights counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    emb = model.get_input_embeddings().weight.numel()
    return {"total": total, "non_embedding": total - emb}
