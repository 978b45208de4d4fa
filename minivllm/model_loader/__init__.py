"""Building a model on the meta device and filling in its weights."""
