"""What a reader sees: ``results/findings.md`` (sentences from the run's own tables)
and the figures.
"""
