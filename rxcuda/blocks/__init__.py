"""Declarations: blocks and their builder, composites, regions, and shapes while declaring. Nothing here
touches the GPU or runs a pipeline (that is ``rxcuda.engine``). Import public names from ``rxcuda``."""
