"""What the records show: equivalence classes, remaining and effective precision, where
devices part and why, kernels, the observer check, and the summation orders
(``accumulation/``). Pure numerics over records and arrays: no runtime is imported here.
"""
