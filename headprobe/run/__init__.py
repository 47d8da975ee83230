"""A run: its folder, its context and its stages."""
