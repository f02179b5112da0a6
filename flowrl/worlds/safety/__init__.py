"""In-generation safety in the shapes world: the stand-in unsafe concept and its prompt sets."""
