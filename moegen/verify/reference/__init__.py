"""The dense reference the twins are held against, written independently of the templates:
the layer (layer), its configuration (fields), its router (routing), its argument checks
(checks), and twin parity against it inside the worker (parity).

This package face only names its modules; moegen.verify re-exports what other stages use.
"""
