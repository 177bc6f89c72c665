"""Task sources: reasoning-gym, HumanEval, users' JSONL/Parquet files; and the resumable stream."""
