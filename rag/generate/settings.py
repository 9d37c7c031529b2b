"""Generation settings: which decoder writes the answer and how it decodes, in one dataclass whose
defaults are the only decoding defaults in the project.

Owned here, beside the engines they configure, and passed whole: :class:`rag.config.RAGConfig`
``.generate``, ``rag.toml``'s ``[generate]`` table, and :func:`rag.generate.load.load_decoder`,
which builds either engine from it. The decoder speed options (int8 decode layers,
``torch.compile``, a static KV cache: :mod:`rag.generate.speed`) are fields here like the others;
:attr:`GenerationSettings.speed` is what the torch engine applies.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from rag.answer.prompt import PROFILES
from rag.defaults import DEFAULT_MAX_NEW_TOKENS, DEFAULT_PROMPT_CACHE_MB, DEFAULT_PROMPT_LOOKUP
from rag.generate.engines import ENGINES
from rag.generate.speed import CACHE_IMPLEMENTATIONS, DecodeSpeed
from rag.models import DEFAULT_ADAPTER, DEFAULT_DECODER
from rag.models.precision import PRECISION_SETTINGS


@dataclass(frozen=True)
class GenerationSettings:
    """The decoder and its decoding (module docstring)."""

    decoder: str = DEFAULT_DECODER  # causal LM alias or folder that writes the answer
    # the decoder that copies a factoid's short answer out of the encoder's two best sentences
    # (rag.answer.compose.extract_short_answer): auto = qwen2.5-coder-1.5b when `decoder` is the
    # default and its parts are installed (make setup), else `decoder` | same = `decoder` | an
    # alias or folder (docs/answering.md, step 4)
    factoid_decoder: str = "auto"
    # peft LoRA adapter for the decoder: auto = <decoder>-span-lora under $RAG_HOME/models, the
    # reader-first adapter `make models` trains (the base model alone when absent); none = the
    # base model alone; or a folder/name (docs/answering.md)
    adapter: str | None = DEFAULT_ADAPTER
    # the decoder's inference engine (rag.generate.ov_engine): auto = OpenVINO GenAI where it
    # runs the decoder (a GGUF decoder on the CPU, no LoRA adapter), else torch | torch |
    # openvino
    engine: str = "auto"
    # decoder weights (rag.models.precision): auto = bf16 on CUDA or a CPU with bf16 units (AMX),
    # else fp32 | fp32 | bf16 | int8 = decode steps through int8 copies of the linear layers
    # (CPU; the prompt runs on the auto float weights; benchmarks.decode_variants). On the
    # OpenVINO engine, its compute precision: auto = f32 for the answering decoder on a CPU
    # with AMX (where the engine picks bf16 and decodes slower), else the engine's own | fp32 |
    # bf16 | int8 = the engine's own (rag.generate.ov_engine.inference_precision)
    decoder_precision: str = "auto"
    # prompt format (rag.answer.prompt.PROFILES): auto = the decoder's measured best (rag.models)
    profile: str = "auto"
    temperature: float = 0.0  # 0 = greedy decoding (deterministic); > 0 samples
    top_p: float = 1.0  # nucleus sampling mass when temperature > 0
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS  # answer length limit in decoder tokens
    max_context_tokens: int | None = 2048  # prompt+answer cap below the decoder's max positions
    prefix_cache: bool = True  # reuse the KV cache of the fixed system prompt across questions
    # keys and values of recent prompts kept per decoder and reused by their longest shared token
    # prefix (passages another request already read: rag.generate.prompt_cache); MB, 0 = off
    prompt_cache_mb: int = DEFAULT_PROMPT_CACHE_MB
    # OpenVINO engine: prompt lookup decoding proposes this many next tokens per step by
    # matching the answer's last words in the prompt, and one forward checks them all (greedy
    # answers stay the model's own; an answer that copies its excerpts decodes in fewer steps:
    # docs/benchmarks.md); 0 = off. The torch engine does not use it
    prompt_lookup: int = DEFAULT_PROMPT_LOOKUP
    batching: bool = True  # decode concurrent requests together (rag.generate.batching)
    max_batch: int = 16  # rows per decode step when batching is on
    # requests that arrive together are prefilled in padded forwards of at most this many tokens
    # (rows x longest suffix; rag.generate.batching): bounds the memory of one forward
    max_prefill_tokens: int = 4096
    # torch.compile the decoder's forward (dynamic cache) or generate's decode step (static
    # cache); rag.generate.speed, measured by benchmarks.decode_variants
    decoder_compile: bool = False
    # KV cache: dynamic (grows per token) | static (preallocated; needs --no-batching)
    cache_implementation: str = "dynamic"

    # The value sets of the fields that have one: checked here, argparse choices on every CLI.
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "engine": ENGINES,
        "decoder_precision": PRECISION_SETTINGS,
        "profile": ("auto", *PROFILES),
        "cache_implementation": CACHE_IMPLEMENTATIONS,
    }

    def __post_init__(self) -> None:
        for name, values in self.CHOICES.items():
            if getattr(self, name) not in values:
                flag = "--" + name.replace("_", "-")
                raise ValueError(
                    f"{flag} must be one of {', '.join(values)}, not {getattr(self, name)!r}"
                )
        if not 0 <= self.prompt_lookup <= 32:
            raise ValueError(f"--prompt-lookup must be 0 (off) to 32, not {self.prompt_lookup!r}")
        for name in ("max_new_tokens", "max_batch", "max_prefill_tokens"):
            if int(getattr(self, name)) < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be >= 1, not {getattr(self, name)!r}")
        if self.max_context_tokens is not None and self.max_context_tokens < 1:
            raise ValueError(
                f"--max-context-tokens must be >= 1 or none, not {self.max_context_tokens}"
            )
        if self.temperature < 0:
            raise ValueError(f"--temperature must be >= 0, not {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], not {self.top_p}")
        if self.prompt_cache_mb < 0:
            raise ValueError(
                f"--prompt-cache-mb must be >= 0 (0 = off), not {self.prompt_cache_mb}"
            )
        self.speed.check(batching=self.batching)  # combinations that cannot work: one line

    @property
    def speed(self) -> DecodeSpeed:
        """The speed options the torch engine applies (:mod:`rag.generate.speed`)."""
        speed = DecodeSpeed(compile=bool(self.decoder_compile), cache=self.cache_implementation)
        return speed.with_precision(self.decoder_precision)

    @property
    def prompt_cache_budget_mb(self) -> int:
        """MB the prompt cache may hold: ``prompt_cache_mb``, 0 with ``--no-prefix-cache``."""
        return self.prompt_cache_mb if self.prefix_cache else 0

    def check_device(self, device: str) -> None:
        """Refuse the options that cannot run on ``device`` (one line naming the flags)."""
        self.speed.check(device=device, batching=self.batching)

    def replace(self, **changes: Any) -> GenerationSettings:
        """A copy with ``changes`` applied (checked again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
