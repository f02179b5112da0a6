"""The shapes-editing world: a source scene of the image world plus an instruction, the exact target scene, and a
verifier of the minimal-change principle (the requested change made, nothing else changed, off-target pixels)."""
