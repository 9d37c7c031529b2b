"""Where artefacts and index generations live on disk: :mod:`rag.storage.paths` (``$RAG_HOME``,
index names and folders, document names as people see them) and :mod:`rag.storage.manifest` (an
index's generations, manifest and chunk store, published atomically)."""
