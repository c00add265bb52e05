"""The running pipeline: the Engine and its verbs, the Structure tier (build), updates by tier, data in and
out, hot reload, profiling and GPU-driven batches. Import public names from ``rxcuda``."""
