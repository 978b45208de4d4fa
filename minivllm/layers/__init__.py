"""Building blocks shared by every model: a new model family is a short file."""
