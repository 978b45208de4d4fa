"""The engine: requests in, outputs out (LLMEngine -> EngineCore)."""
