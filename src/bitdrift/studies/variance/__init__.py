"""Training variance (Morin & Willetts; Zhuang et al.; the hardware proposal): plans of
arms with seed switches, one run per job, and statistics over the runs."""
