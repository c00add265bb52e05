"""Descriptions, planner, CUDA layer and the engine. Import public names from ``rxcuda``."""
