"""fabriclab: an emulation lab for the networks that train AI models."""
