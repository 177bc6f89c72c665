"""hetrl: RL post-training of LLMs on heterogeneous Slurm jobs."""

__version__ = "0.1.0"
