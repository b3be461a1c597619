"""What a run reads: datasets, the Keras architectures (with casting and per-layer
probes), the example models of each format, and the committed reference model
(``reference_set``, the atlas's model).
"""
