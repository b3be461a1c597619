"""Nonsmooth autodiff through MaxPool (Boustany): Jacobian programs, backprop variation,
bifurcation zones and hybrid-beta training, in PyTorch."""
