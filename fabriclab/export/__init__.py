"""A spec's fabric written out for other tools (`containerlab`)."""
