"""envbuild: lockfiles, verified pins and reproducible images for Ascend RL training."""

__version__ = "0.1.0"
