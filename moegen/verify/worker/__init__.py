"""The verify workers: the child process that imports, runs the twins and compiles (child:
`python -m moegen.verify.worker.child JOB.json`), its devices and compiles (compiled, cuda),
the parent's pool of them (pool) and the heartbeat while they run (heartbeat).

This package face only names its modules; moegen.verify re-exports what other stages use.
"""
