"""Forensic probes: crafted inputs that split a set of devices into as many bitwise
classes as possible (Schlögl, Hofer & Böhme's boundary samples; HSPI's border inputs).

``search`` finds probes by evaluating candidates on a *search* subset of the devices
only (each device once per generation, all candidates batched, through the core's
inference in a process of its own); ``evaluation`` judges them on the other, held-out
devices against the natural test samples. A probe file is a dataset file (its test set
is the probes), so the normal inference and analysis run it like any sample.
"""
