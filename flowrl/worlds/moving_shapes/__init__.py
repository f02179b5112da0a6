"""The moving-shapes world: clips, a prompt grammar with VBench-style tags, and a rule-based video verifier."""
