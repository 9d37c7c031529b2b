"""Training data of the fine-tunes (docs/training.md), kept apart from the training loops so
each builder is testable without a model: contrastive pairs (:mod:`~training.data.pairs`),
reranker queries and hard negatives (:mod:`~training.data.rerank_data`), reader windows
(:mod:`~training.data.reader_data`) and grounded-QA examples (:mod:`~training.data.lora_data`
from SQuAD, :mod:`~training.data.doc_qa_data` from documentation, with
:mod:`~training.data.doc_questions` and :mod:`~training.data.doc_markup`), in the form and with
the distractor/gold placement of :mod:`~training.data.qa_example`.

Nothing is imported here.
"""
