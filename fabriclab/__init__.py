"""fabriclab: an emulation lab for the networks that train AI models."""
__version__ = "0.1.0"
