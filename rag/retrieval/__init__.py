"""Retrieval: the query encoder, BM25, dense/BM25/hybrid search with fusion, the rerank stage,
and the one set of settings every caller opens a retriever with (:mod:`rag.retrieval.settings`)."""
