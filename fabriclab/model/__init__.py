"""Analytical models: what a collective should take on real hardware, away from the emulation."""
