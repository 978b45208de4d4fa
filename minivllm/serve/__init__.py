"""The OpenAI-compatible HTTP server (task=serve): FastAPI app over AsyncLLM."""
