"""A PyTorch ``torch.export`` program (``.pt2``): the program itself (``program``), torch
eager (``eager``, backend ``torch_export``), torch.compile's Inductor (``inductor``),
ExecuTorch (``executorch``, run by ``executorch_runner``), and the program's conversions
to the other runtimes' formats (``conversions``).
"""
