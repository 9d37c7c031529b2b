"""Fine-tunes that turn pretrained models into the RAG system's parts (docs/training.md): a
retriever (:mod:`~training.finetune.contrastive`), a cross-encoder reranker
(:mod:`~training.finetune.rerank`), an extractive reader (:mod:`~training.finetune.reader`, with
:mod:`~training.finetune.decoder_qa` for causal decoders) and a grounded answerer
(:mod:`~training.finetune.lora`, scored by :mod:`~training.finetune.lora_eval`), all on the
shared recipe of :mod:`~training.finetune.recipe`. Their training data is built in
:mod:`training.data`.

Nothing is imported here: each CLI runs as ``python -m training.finetune.<name>``.
"""
