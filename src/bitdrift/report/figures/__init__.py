"""The figures, a module per family: the equivalence classes (``eqc``), remaining precision
per layer (``remaining_precision``), where devices part ways (``divergence``), the kernels
per layer (``kernels``), the summation orders (``orders``), and the machines: CPU
generations and the atlas (``machines``), quantized models against their float model
(``quantization``); the layer axis they share (``layer_marks``) and
the samples drawn as one line where they coincide (``samples``).
"""

import matplotlib

# Figures are files, drawn where there is no display (a job on a cluster node): the
# backend is chosen before any module of the package imports pyplot, and this package's
# __init__ runs before each of them.
matplotlib.use("Agg")
