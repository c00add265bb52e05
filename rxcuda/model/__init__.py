"""The shared vocabulary, pure data: descriptions, events, tiers, dtypes and errors. Imports nothing above it."""
