"""Vision encoders shared by the vision-language models."""
