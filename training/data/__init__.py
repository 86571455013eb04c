"""Data for distillation runs: the seeded demo generator and loaders for standard formats."""
