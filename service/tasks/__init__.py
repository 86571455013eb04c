"""Pure per-task pre/post-processing: arrays in, results out; no asyncio, no HTTP."""
