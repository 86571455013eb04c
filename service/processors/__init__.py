"""Turn a validated request into engine work and engine outputs into results (vLLM's processors).

Each function takes a served model and plain Python values, and returns plain results; the API layer
translates HTTP to these calls and back, nothing more.
"""
