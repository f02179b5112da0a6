"""The visuo-tactile world: procedural materials as height fields and a differentiable optical tactile sensor
(a curved gel, its normals, three coloured lights), the ground truth that visual-to-tactile synthesis is judged
against."""
