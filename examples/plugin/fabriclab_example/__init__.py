"""fabriclab plugin example: the `first-path` routing app and the `first-path-vs-ecmp` experiment."""
