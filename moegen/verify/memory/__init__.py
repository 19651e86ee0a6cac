"""Memory verdicts: XLA's buffer assignment read before code generation (assigned, its worker
assigned_worker; xla_reads hands it to the fit stage), the compiled peak against HBM in words
(verdict) and what a compiler's out-of-memory error says (compiler_errors).

This package face only names its modules; moegen.verify re-exports what other stages use.
"""
