"""Verification records and kept reads, read back as untrusted input: records of passed
verifications (record), their steps judged again (evidence), read strictly (strict), and
XLA's buffer assignment reads kept (read_record).

This package face only names its modules; moegen.verify re-exports what other stages use.
"""
