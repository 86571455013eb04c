"""Benchmarks that measure distilserve against its references, in process and over HTTP.

Unlike loadtests/ (load over HTTP against any running server), these build models, run engines in process,
and start the reference servers (bare ASGI, naive PyTorch) beside the service; they may import every stage.
"""
