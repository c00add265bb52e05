"""The pure planner: validate, order, size buffers, map parameters to argument slots -> an immutable GraphPlan.
Imports nothing from CUDA."""
