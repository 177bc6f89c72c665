"""HF-side model description shared by the trainer (import/export) and the engines (serving)."""
