"""Images as prompt inputs: parsing, loading, the checkpoint's processor, and the
feature each image becomes (``feature.py``, the one type the engine core sees)."""
