"""Pure helpers that several stages share, so that no stage imports another's internals.

Light by rule: nothing here imports torch, transformers, onnx or onnxruntime. `common.cli` needs typer
(every CLI has it); `common.spans` (extractive QA's span decoding: the service answers with it, training
evaluates with it) needs numpy; `common.progress` and `common.provenance` (checksums, the git revision)
need only the standard library.
"""
