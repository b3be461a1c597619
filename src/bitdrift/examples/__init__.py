"""Small models in each format bitdrift reads, built here (no download): the preset
config/presets/your_model.yaml runs them, and the tests build them too.

    python -m bitdrift.examples onnx OUT.onnx INPUTS.npy [--samples N]
"""
