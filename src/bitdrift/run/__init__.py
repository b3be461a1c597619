"""Running on devices: the devices' settings and fingerprints, the inference parent and
its repeats, training, the worker processes and the fork server, provenance checks, and
``repro`` (one layer re-run on each device's runtime).
"""
