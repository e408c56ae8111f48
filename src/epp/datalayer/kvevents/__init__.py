"""The engines' own KV-cache events (vLLM's BlockStored / BlockRemoved / AllBlocksCleared over ZMQ).

``hashing`` computes block hashes exactly as the engine does, ``wire`` decodes event batches,
``index`` keeps which endpoint holds which block (bounded, with a consistency state per
endpoint), ``subscriber`` runs one ZMQ SUB per endpoint and feeds the index, ``tokens`` turns a
request into the token ids the engine will see.  The ``kv-events-source`` data source and the
``precise-prefix-cache-scorer`` are built from these; see docs/precise-prefix.md.
"""
