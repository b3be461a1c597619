"""Keras on its three backends (tensorflow, torch, jax): one runtime module each,
what they share (``common``), and the conversion of a Keras model to the exported
runtimes' files (``export``).
"""
