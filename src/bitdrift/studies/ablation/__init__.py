"""Ablation study (Schlögl et al., supplement E): model variants (activation, pooling,
trained or not) and precision casting, run through the core's train/infer/analyse steps."""
