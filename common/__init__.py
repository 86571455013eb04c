"""Pure helpers that several stages share, so that no stage imports another's internals.

Light by rule: nothing here imports torch, transformers, onnx or onnxruntime. `common.cli` needs typer
(every CLI has it); `common.progress` needs only the standard library.
"""
