"""transformers as the test oracle (tests/model_families/test_transformers_oracle.py).

families.py   the oracle's view of the one table of model families (tests/support/families.py:
              transformers' MoE block and config class, the tiny config with that model's
              routing, the moegen spec choices that should match it), with the mapping of the
              block's weights to moegen's parameters;
hf_blocks.py  builds a block (float32, eval, eager experts, seeded weights, non-zero biases),
              runs it (output and input gradient), counts clamps that bite, and holds the
              weight layouts of transformers' expert modules, written independently of moegen;
moegen_side.py renders a spec in-process (moegen's render stage, no `moegen build`, no twins),
              imports the module and runs it on fake CPU devices.

Only the test imports this package, and only after torch and transformers imported (or the
test was skipped).
"""
