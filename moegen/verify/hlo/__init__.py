"""What a compiled program says: the one HLO parser (parse), its collectives and whether
compute overlaps them (collectives, overlap), the compiler's counters (counters) and the loop
trips they leave out (loops).

This package face only names its modules; moegen.verify re-exports what other stages use.
"""
