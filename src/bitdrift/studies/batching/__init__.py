"""Batch invariance: does one input's answer change with the batch it runs in?

Per device, each studied input runs alone and then in other batches (sizes, positions,
neighbours, padding to another sequence length); every recorded layer's output of that
input is compared bit for bit with its batch-of-1 output, and where it differs the
remaining precision says by how much. Greedy decoding from a few prompts shows the
symptom users see: the first generated token where a batch setting departs from the
batch-of-1 text."""
