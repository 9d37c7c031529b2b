"""A span head on the causal decoder: how the CLM row of the division-of-labour experiment reads.

transformers has ``ModernBertForQuestionAnswering`` (the bidirectional encoder) but no
question-answering class for ``ModernBertDecoder``, so ``AutoModelForQuestionAnswering`` cannot
open a CLM folder. :class:`ModernBertDecoderForQuestionAnswering` is the decoder's own backbone
(``ModernBertDecoderModel``: its causal, sliding-window masks and its weights, loaded from the
CLM folder) with the encoder QA class's head on top (the prediction head's dense + norm, loaded
from the decoder's ``lm_head``, then a fresh 2-logit classifier), so a CLM reads exactly as it
was pretrained: each token sees the question (it comes first) and the passage up to itself.
The ``[CLS]``/``<s>`` position, whose logits give the null score, sees only itself under a causal
mask; the null score is then a learned constant the span scores are compared against.

:func:`register` makes ``AutoModelForQuestionAnswering`` (training.finetune.reader, SpanReader) open
decoder folders and the reader folders trained from them, in this process.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import (
    AutoModelForQuestionAnswering,
    ModernBertDecoderConfig,
    ModernBertDecoderModel,
)
from transformers.modeling_outputs import QuestionAnsweringModelOutput
from transformers.models.modernbert_decoder.modeling_modernbert_decoder import (
    ModernBertDecoderPredictionHead,
    ModernBertDecoderPreTrainedModel,
)


class ModernBertDecoderForQuestionAnswering(ModernBertDecoderPreTrainedModel):
    """Start/end logits per token from the causal ModernBERT decoder (see the module doc)."""

    def __init__(self, config: ModernBertDecoderConfig):
        super().__init__(config)
        self.num_labels = 2
        self.model = ModernBertDecoderModel(config)
        self.lm_head = ModernBertDecoderPredictionHead(config)  # the CLM folder's head.dense/norm
        self.drop = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput:
        kwargs.pop("token_type_ids", None)  # the tokenizer's pair ids: no such embedding here
        hidden = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).last_hidden_state
        logits = self.classifier(self.drop(self.lm_head(hidden)))
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringModelOutput(
            loss=loss, start_logits=start_logits, end_logits=end_logits
        )


def register() -> None:
    """Let ``AutoModelForQuestionAnswering`` build this class for ModernBERT decoder configs."""
    AutoModelForQuestionAnswering.register(
        ModernBertDecoderConfig, ModernBertDecoderForQuestionAnswering, exist_ok=True
    )
