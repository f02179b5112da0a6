"""`flowrl pretrain` recipes that produce the embedded default pipelines from the shapes renderer."""
