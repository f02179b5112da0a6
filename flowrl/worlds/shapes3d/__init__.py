"""The 3D shapes world (image-to-3D): solids of one to three primitives as analytic SDFs, a prompt grammar with a
held-out split, condition images rendered from a fixed view, meshes by marching cubes and geometric metrics."""
